// Python entry points of the CPU kernels, registered by the op files themselves: each
// op's .cpp ends with a static Registrar whose binder defines that op's functions in
// roiops._C, and bindings.cpp's PYBIND11_MODULE runs every binder. An op is thus one
// .cpp and no central list; the function names and argument orders are the kernel
// contract of docs/architecture.md, by which the Python side calls them.
//
// The binders are kept in a function-local static, built on first use: registrars in
// different translation units are constructed in an unspecified order, and this way
// none of them can find the list unconstructed. They all run while the shared object
// loads, before Python calls its init function.
#pragma once

#include <torch/extension.h>

#include <vector>

namespace roiops {

using Binder = void (*)(pybind11::module_& m);

inline std::vector<Binder>& binders() {
  static std::vector<Binder> list;
  return list;
}

struct Registrar {
  explicit Registrar(Binder binder) { binders().push_back(binder); }
};

}  // namespace roiops
