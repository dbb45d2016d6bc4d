// How the CPU kernels share a call's work among threads: tasks handed out one at a time,
// and how many channels a task takes so that there are enough tasks for all threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "torch_api.h"

namespace roiops {

// Runs f(task) for every task in [0, n) on all threads, handing tasks out one at a time:
// task costs vary (boxes differ in size), and a static split would leave a thread idle.
// Results never depend on which thread runs a task.
template <typename F>
void parallel_tasks(int64_t n, const F& f) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(num_threads(), n);
  parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) f(t);
  });
}

// Boxes of each image, in increasing k (the order every backward accumulates in).
inline std::vector<std::vector<int64_t>> boxes_by_image(const std::vector<int64_t>& batch, int64_t n_images) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n_images));
  for (size_t k = 0; k < batch.size(); ++k) out[static_cast<size_t>(batch[k])].push_back(static_cast<int64_t>(k));
  return out;
}

// Channels per (image, block of channels) task: up to `widest`, halved (down to 4) while
// the tasks would not keep the threads busy.
inline int64_t channel_block(int64_t N, int64_t C, int64_t widest) {
  const int64_t want = 2 * num_threads();
  int64_t cb = std::min<int64_t>(C, widest);
  while (cb > 4 && N * ((C + cb - 1) / cb) < want) cb /= 2;
  return std::max<int64_t>(cb, 1);
}

// Channels per task of a channels_last forward that runs each of K boxes in place: all C
// of them, unless the boxes are too few to share out; then blocks of whole vectors of 8,
// at least 32 channels each. Tasks: K * ceil(C / block).
inline int64_t cl_box_channel_block(int64_t K, int64_t C) {
  const int64_t spread = (8 * num_threads() + K - 1) / std::max<int64_t>(K, 1);
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(spread, C / 32));
  return want == 1 ? std::max<int64_t>(C, 1) : ((C + want - 1) / want + 7) / 8 * 8;
}

// Channels per channels-last backward task: all of them, unless `bands` tasks would leave
// threads idle; then blocks of a multiple of 16 channels (whole cache lines of float).
inline int64_t cl_channel_block(int64_t bands, int64_t C) {
  const int64_t want = 4 * num_threads();
  if (bands >= want) return C;
  const int64_t blocks = std::min((want + bands - 1) / bands, std::max<int64_t>(C / 16, 1));
  return std::min(C, ((C + blocks - 1) / blocks + 15) / 16 * 16);
}

}  // namespace roiops
