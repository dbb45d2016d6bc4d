// What the vectorised kernels are built from: the instruction-set versions of the per-box
// kernels (ROIOPS_SIMD), vectors of 8 lanes, the in-register block transpose, and
// software prefetch of the runs a kernel reads next.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace roiops {

// The per-box kernels are compiled twice, for x86-64-v3 (AVX2 and FMA) and for baseline
// x86-64, and the dynamic loader picks the version for the running CPU (function
// multiversioning), so the wheel still runs on any x86-64. ROIOPS_NO_MULTIVERSION turns
// this off. -ffp-contract=off keeps the compiler from fusing operations on its own, so
// both versions compute the same bits; only explicit std::fma calls use FMA.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(ROIOPS_NO_MULTIVERSION)
#define ROIOPS_SIMD __attribute__((target_clones("arch=x86-64-v3", "default")))
inline bool hardware_fma() {
  static const bool has = __builtin_cpu_supports("x86-64-v3");
  return has;
}
#else
#define ROIOPS_SIMD
inline bool hardware_fma() {
#if defined(__aarch64__) || defined(__FMA__)
  return true;
#else
  return false;  // std::fma would be a slow library call
#endif
}
#endif

// May a float32 division t / c (c a sample count) be replaced by Markstein's FMA
// sequence (align_kernels.h, TermDiv::kFma)? Only where FMA is an instruction, and for the
// counts that sequence was checked exhaustively against division.
template <typename T>
inline bool float_fma_div_ok(T c) {
  return std::is_same_v<T, float> && c <= T(65536) && hardware_fma();
}

// Eight values of T (float or double) as one vector value (GCC/Clang vector extensions):
// each lane one channel, each operation the scalar one lane by lane, so code on lanes
// computes the same bits as the scalar loop it replaces; the compiler lowers a vector to
// what the instruction set of each ROIOPS_SIMD version has.
template <typename T>
struct Lanes8 {
  typedef T type __attribute__((vector_size(8 * sizeof(T))));
};
template <typename T>
using lanes8 = typename Lanes8<T>::type;

template <typename T>
inline lanes8<T> load8(const T* p) {
  lanes8<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void store8(T* p, lanes8<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define ROIOPS_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#endif
#endif

// An 8 x 8 block transposed: rows r[0..7] in, columns out (out[c][l] = r[l][c]).
template <typename T>
inline void transpose8(const lanes8<T> (&r)[8], lanes8<T> (&out)[8]) {
#ifdef ROIOPS_SHUFFLE
  // Three rounds of two-input shuffles: pairs of rows, pairs of pairs, halves.
  lanes8<T> t[8], u[8];
  for (int a = 0; a < 8; a += 2) {
    t[a] = ROIOPS_SHUFFLE(r[a], r[a + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[a + 1] = ROIOPS_SHUFFLE(r[a], r[a + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int a = 0; a < 8; a += 4) {
    u[a] = ROIOPS_SHUFFLE(t[a], t[a + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[a + 1] = ROIOPS_SHUFFLE(t[a], t[a + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[a + 2] = ROIOPS_SHUFFLE(t[a + 1], t[a + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[a + 3] = ROIOPS_SHUFFLE(t[a + 1], t[a + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int a = 0; a < 4; ++a) {
    out[a] = ROIOPS_SHUFFLE(u[a], u[a + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[a + 4] = ROIOPS_SHUFFLE(u[a], u[a + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
#else
  for (int c = 0; c < 8; ++c) {
    for (int l = 0; l < 8; ++l) out[c][l] = r[l][c];
  }
#endif
}

// transpose_block's default order, for a src of at most kChunkRows rows, goes by passes of
// kChunkCols columns, each down all rows, so that the dst rows a pass fills (one run
// each) are finished while still in L1; one pass over all columns of a wide tile would
// write each dst line several times over, fetching it again from L2 each time. Taller
// sources keep one pass: many short src runs per pass read slower than few long ones.
constexpr int64_t kChunkRows = 32, kChunkCols = 64;

// dst[j * ds + i] = src[i * ss + j] for i < rows, j < cols: a matrix transposed, by 8 x 8
// blocks in registers for float and double (values are only moved or converted).
// kPadRows: dst rows have room for rows rounded up to a multiple of 8, which get zeros.
// kReadPastCols: src rows may be read up to cols rounded up to a multiple of 8.
// Default order: row blocks outer, by passes of kChunkCols columns for short sources.
// kColsOuter: blocks go along src rows within each block of 8 columns, so that dst is
// written 8 rows at a time from start to end: for dst rows that are long and far apart
// (planes), 8 sequential write streams instead of one per column. kPrefetch (default
// order): while a pass transposes, the lines of the next pass are prefetched, one line of
// each src row per line's worth of columns, for src rows far apart (NCHW planes): more
// streams than hardware prefetchers follow. Always inlined, so that it is compiled for
// the instruction set of the ROIOPS_SIMD caller.
template <bool kPadRows, bool kReadPastCols, bool kColsOuter = false, bool kPrefetch = false, typename S, typename D>
__attribute__((always_inline)) inline void transpose_block(const S* src, int64_t ss, int64_t rows, int64_t cols,
                                                         D* dst, int64_t ds) {
  if constexpr (std::is_same_v<S, D> && std::is_floating_point_v<D>) {
    const auto block = [&](int64_t i, int64_t j) __attribute__((always_inline)) {
      const int64_t ni = std::min<int64_t>(8, rows - i), nj = std::min<int64_t>(8, cols - j);
      // A block with rows or columns beyond what src or dst have: element by element.
      if ((nj < 8 && !kReadPastCols) || (ni < 8 && !kPadRows)) {
        for (int64_t k = 0; k < nj; ++k) {
          for (int64_t l = 0; l < (kPadRows ? 8 : ni); ++l) {
            dst[(j + k) * ds + i + l] = l < ni ? static_cast<D>(src[(i + l) * ss + j + k]) : D(0);
          }
        }
        return;
      }
      // Unrolled, with a test per vector, so that the vectors stay in registers: a loop up
      // to ni or nj would index them at run time, through the stack.
      lanes8<D> r[8], o[8];
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) r[l] = l < ni ? load8(src + (i + l) * ss + j) : lanes8<D>{};
      transpose8<D>(r, o);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        if (k < nj) store8(dst + (j + k) * ds + i, o[k]);
      }
    };
    if constexpr (kColsOuter) {
      for (int64_t j = 0; j < cols; j += 8) {
        for (int64_t i = 0; i < rows; i += 8) block(i, j);
      }
    } else {
      const int64_t pass = rows <= kChunkRows ? kChunkCols : cols;
      for (int64_t j0 = 0; j0 < cols; j0 += pass) {
        const int64_t j1 = std::min(cols, j0 + pass);
        for (int64_t i = 0; i < rows; i += 8) {
          for (int64_t j = j0; j < j1; j += 8) {
            if constexpr (kPrefetch) {
              constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S));
              if ((j - j0) % kLine == 0 && j + pass < cols) {
                const int64_t l1 = std::min<int64_t>(rows, i + 8);
                for (int64_t l = i; l < l1; ++l) __builtin_prefetch(src + l * ss + j + pass);
              }
            }
            block(i, j);
          }
        }
      }
    }
  } else {
    for (int64_t i = 0; i < (kPadRows ? (rows + 7) / 8 * 8 : rows); ++i) {
      for (int64_t j = 0; j < cols; ++j) dst[j * ds + i] = i < rows ? static_cast<D>(src[i * ss + j]) : D(0);
    }
  }
}
// The frame of a "max" kernel that vectorises along n channels: for each bin (i, j) in
// row-major order, scan(i, j, n, best, idx) leaves the bin's maxima and their sample
// indices in best[c] and idx[c] (c < n), which are then written to out and am at
// i * oH + j * oW + c * oC. The arrays are the kernel's own when kN = n is known at compile
// time (so that they stay in registers), else the caller's best_ and idx_. Always inlined,
// so that it is compiled for the instruction set of the ROIOPS_SIMD caller.
template <int64_t kN, typename T, typename scalar_t, typename Scan>
__attribute__((always_inline)) inline void max_bins(int64_t n_, int64_t ph, int64_t pw, T* best_, int32_t* idx_,
                                                    scalar_t* out, int32_t* am, int64_t oH, int64_t oW, int64_t oC,
                                                    const Scan& scan) {
  const int64_t n = kN ? kN : n_;
  T best_k[kN ? kN : 1];
  int32_t idx_k[kN ? kN : 1];
  T* __restrict__ best = kN ? best_k : best_;
  int32_t* __restrict__ idx = kN ? idx_k : idx_;
  for (int64_t i = 0; i < ph; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      scan(i, j, n, best, idx);
      scalar_t* o = out + i * oH + j * oW;
      int32_t* m = am + i * oH + j * oW;
      for (int64_t c = 0; c < n; ++c) {
        o[c * oC] = static_cast<scalar_t>(best[c]);
        m[c * oC] = idx[c];
      }
    }
  }
}

// Asks for the n contiguous elements at p ahead of use: a run the hardware prefetchers
// would only start on after its first misses (a channels-last bin of grad, 1 KiB for 256
// channels, read from memory while the previous bin is added).
template <typename S>
__attribute__((always_inline)) inline void prefetch_run(const S* p, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(S);
  for (int64_t e = 0; e < n; e += kLine) __builtin_prefetch(p + e);
}

// Asks for a box's block of grad (or argmax) ahead of use: channels [c0, c0 + nc) of its
// ph x pw bins, at p + i * sH + j * sW + c * sC. Channels-last blocks are one short run per
// bin, 1 KiB or more apart, a pattern the hardware prefetchers do not follow.
template <typename S>
inline void prefetch_block(const S* p, int64_t sC, int64_t sH, int64_t sW, int64_t nc, int64_t ph, int64_t pw) {
  if (sC == 1) {
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) prefetch_run(p + i * sH + j * sW, nc);
    }
  } else if (sH == pw && sW == 1 && sC == ph * pw) {  // NCHW: one contiguous run
    prefetch_run(p, nc * sC);
  }
}

}  // namespace roiops
