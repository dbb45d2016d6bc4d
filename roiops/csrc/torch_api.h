// Everything the CPU kernels take from LibTorch, through its stable ABI only (the headers
// of torch/csrc/stable and torch/headeronly, which call into libtorch through a versioned
// C interface): built with TORCH_TARGET_VERSION (setup.py), one build runs under every
// torch release from that version on. Any other torch header refuses to compile under it.
// The kernels see tensors through these few names, so that the rest of the sources speak
// of shapes, strides and pointers.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/shim_utils.h>

#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace roiops {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using MemoryFormat = torch::headeronly::MemoryFormat;
using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;

constexpr ScalarType kHalf = ScalarType::Half, kBFloat16 = ScalarType::BFloat16, kFloat = ScalarType::Float,
                     kDouble = ScalarType::Double, kInt = ScalarType::Int;

// The type a kernel computes in for a stored type: float for the 16-bit floats (as
// ATen's opmath), the type itself otherwise.
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <typename T>
using opmath_type = typename OpMath<T>::type;

template <typename T>
constexpr ScalarType scalar_type_of = torch::headeronly::CppTypeToScalarType<T>::value;

// ---- Errors ---------------------------------------------------------------------------
//
// A refused argument throws std::invalid_argument, which torch's Python binding raises as
// ValueError (tests/test_contract.py holds every backend to that); torch's own error
// classes are not part of the stable ABI. A failed allocation throws std::bad_alloc
// (MemoryError). Nothing throws inside a parallel region: an exception that crosses
// libtorch's C interface comes back as a RuntimeError.

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

#define ROIOPS_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) throw std::invalid_argument(::roiops::cat(__VA_ARGS__));                \
  } while (0)

// A dtype as Python writes it ("torch.float32").
inline std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::ComplexHalf: return "torch.complex32";
    case ScalarType::ComplexFloat: return "torch.complex64";
    case ScalarType::ComplexDouble: return "torch.complex128";
    case ScalarType::Bool: return "torch.bool";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    case ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case ScalarType::Float8_e8m0fnu: return "torch.float8_e8m0fnu";
    default: return "torch." + std::string(torch::headeronly::toString(t));
  }
}

// torch.is_floating_point's types.
inline bool is_floating(ScalarType t) {
  switch (t) {
    case ScalarType::Half:
    case ScalarType::BFloat16:
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Float8_e5m2:
    case ScalarType::Float8_e4m3fn:
    case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e4m3fnuz:
    case ScalarType::Float8_e8m0fnu: return true;
    default: return false;
  }
}

// A device as Python writes it ("cpu", "cuda:0").
inline std::string device_name(const Tensor& t) {
  const torch::stable::Device d = t.device();
  std::string type;
  switch (d.type()) {
    case torch::headeronly::DeviceType::CPU: type = "cpu"; break;
    case torch::headeronly::DeviceType::CUDA: type = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: type = "meta"; break;
    case torch::headeronly::DeviceType::MPS: type = "mps"; break;
    case torch::headeronly::DeviceType::XPU: type = "xpu"; break;
    default: type = "device " + std::to_string(static_cast<int>(d.type()));
  }
  return d.has_index() ? type + ":" + std::to_string(d.index()) : type;
}

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }

// A shape as Python writes a list ("[2, 3, 7, 7]").
inline std::string shape_name(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

// ---- Dtype dispatch -------------------------------------------------------------------
//
// Runs a lambda with scalar_t bound to the C++ type of a dtype: every float type the
// kernels have, or float32 and float64 only. The argument checks have refused the others.

#define ROIOPS_DISPATCH_CASE(value, type, ...) \
  case value: {                                \
    using scalar_t = type;                     \
    __VA_ARGS__();                             \
    break;                                     \
  }

#define ROIOPS_DISPATCH_FLOAT(dtype, ...)                                                  \
  switch (dtype) {                                                                         \
    ROIOPS_DISPATCH_CASE(::roiops::kFloat, float, __VA_ARGS__)                             \
    ROIOPS_DISPATCH_CASE(::roiops::kDouble, double, __VA_ARGS__)                           \
    default: throw std::invalid_argument("roiops: unexpected dtype " + ::roiops::dtype_name(dtype)); \
  }

// The floating dtypes the kernels are built for: ROIOPS_DISPATCH's.
inline bool kernel_dtype(ScalarType s) { return s == kHalf || s == kBFloat16 || s == kFloat || s == kDouble; }

#define ROIOPS_DISPATCH(dtype, ...)                                                        \
  switch (dtype) {                                                                         \
    ROIOPS_DISPATCH_CASE(::roiops::kFloat, float, __VA_ARGS__)                             \
    ROIOPS_DISPATCH_CASE(::roiops::kDouble, double, __VA_ARGS__)                           \
    ROIOPS_DISPATCH_CASE(::roiops::kHalf, ::roiops::Half, __VA_ARGS__)                     \
    ROIOPS_DISPATCH_CASE(::roiops::kBFloat16, ::roiops::BFloat16, __VA_ARGS__)             \
    default: throw std::invalid_argument("roiops: unexpected dtype " + ::roiops::dtype_name(dtype)); \
  }

// A call into libtorch's C interface that must succeed.
inline void expect_success(AOTITorchError error, const char* call) {
  if (error != TORCH_SUCCESS) throw std::runtime_error(std::string("roiops: ") + call + " failed");
}

// ---- Threads --------------------------------------------------------------------------
//
// torch's own intra-op pool (torch.set_num_threads sets its size): f(begin, end) runs on
// its threads, compiled here, called once per chunk through a function pointer.

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  torch::stable::parallel_for(begin, end, grain, f);
}

inline int64_t num_threads() { return static_cast<int64_t>(torch::stable::get_num_threads()); }

// The calling thread's index in the pool's current parallel region (0 outside one).
inline int64_t thread_num() {
  uint32_t t = 0;
  expect_success(torch_get_thread_idx(&t), "torch_get_thread_idx");
  return static_cast<int64_t>(t);
}

// ---- Tensors --------------------------------------------------------------------------

inline torch::stable::Device cpu_device() { return torch::stable::Device(torch::headeronly::DeviceType::CPU); }

inline MemoryFormat format_of(bool channels_last) {
  return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

// The strides of a dense [N, C, H, W] tensor in either layout.
inline std::array<int64_t, 4> dense_strides(int64_t C, int64_t H, int64_t W, bool channels_last) {
  return channels_last ? std::array<int64_t, 4>{H * W * C, 1, W * C, C}
                       : std::array<int64_t, 4>{C * H * W, H * W, W, 1};
}

// Tensor.is_contiguous(memory_format=torch.channels_last) of a 4-D tensor: dense in the
// order C, W, H, N, whatever the strides of size-1 dimensions.
inline bool is_channels_last_contiguous(const Tensor& t) {
  if (t.dim() != 4) return false;
  int64_t expected = 1;
  for (const int64_t d : {1, 3, 2, 0}) {
    const int64_t size = t.size(d);
    if (size == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= size;
  }
  return true;
}

inline bool is_contiguous_as(const Tensor& t, bool channels_last) {
  return channels_last ? is_channels_last_contiguous(t) : t.is_contiguous();
}

// t itself when it already has the layout, else a copy in it (torch's contiguous always
// goes through the dispatcher).
inline Tensor in_format(const Tensor& t, bool channels_last = false) {
  return is_contiguous_as(t, channels_last) ? t : torch::stable::contiguous(t, format_of(channels_last));
}

inline Tensor as_strided(const Tensor& t, const std::array<int64_t, 4>& sizes, const std::array<int64_t, 4>& strides) {
  AtenTensorHandle out = nullptr;
  expect_success(aoti_torch_as_strided(t.get(), sizes.data(), strides.data(), &out), "aoti_torch_as_strided");
  return Tensor(out);
}

inline Tensor narrow_view(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Tensor view = t;
  return torch::stable::narrow(view, dim, start, length);
}

inline void fill_zero(const Tensor& t) {
  Tensor view = t;
  torch::stable::zero_(view);
}

inline void copy_into(const Tensor& dst, const Tensor& src) {
  Tensor view = dst;
  torch::stable::copy_(view, src);
}

inline Tensor to_dtype(const Tensor& t, ScalarType dtype) {
  return t.scalar_type() == dtype ? t : torch::stable::to(t, dtype);
}

// Bytes per element of the dtypes the kernels allocate.
inline size_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Double:
    case ScalarType::Long: return 8;
    case ScalarType::Half:
    case ScalarType::BFloat16: return 2;
    default: return 4;  // float32, int32
  }
}

// What a kernel allocates: a dtype and a layout (always on the CPU).
struct Options {
  ScalarType type;
  bool channels_last = false;

  Options dtype(ScalarType t) const { return {t, channels_last}; }
};

inline Options options_of(const Tensor& t, bool channels_last) { return {t.scalar_type(), channels_last}; }

inline Tensor empty(const std::vector<int64_t>& sizes, const Options& options) {
  return torch::stable::empty(sizes, options.type, std::nullopt, cpu_device(), std::nullopt,
                              sizes.size() == 4 ? std::optional<MemoryFormat>(format_of(options.channels_last))
                                                : std::nullopt);
}

inline Tensor zeros(const std::vector<int64_t>& sizes, const Options& options) {
  Tensor t = empty(sizes, options);
  torch::stable::zero_(t);
  return t;
}

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> s(static_cast<size_t>(t.dim()));
  for (int64_t i = 0; i < t.dim(); ++i) s[static_cast<size_t>(i)] = t.size(i);
  return s;
}

}  // namespace roiops
