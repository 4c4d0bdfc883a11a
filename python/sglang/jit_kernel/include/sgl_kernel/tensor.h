// Tensor validation for host launchers: TensorMatcher plus symbolic sizes / dtypes / devices.
//
//   host::SymbolicSize    named size bound by the first tensor that uses it
//   host::SymbolicDType   dtype restricted to a set of options, bound on first use
//   host::SymbolicDevice  device restricted to a set of device types, bound on first use
//   host::TensorMatcher   fluent checker: shape, strides (default: contiguous), dtype, device
//   host::dl_dtype_v<T>   C++ element type -> DLDataType
//   host::data_ptr<T>(v)  typed data address of a TensorView (data + byte_offset)
//   host::verify_no_partial_overlap / verify_no_self_overlap   aliasing checks of outputs
//
// Host-only. When the CUDA headers are reachable (nvcc, or -I <cuda>/include), the CUDA element
// types (__half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2) are mapped too.
#pragma once

#include <sgl_kernel/utils.h>  // For PanicError, detail::panic_at

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <type_traits>

#if __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>) && __has_include(<cuda_fp8.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define SGL_TENSOR_HAS_CUDA_TYPES 1
#else
#define SGL_TENSOR_HAS_CUDA_TYPES 0
#endif

namespace host {

// ---------------------------------------------------------------------------------------------
// C++ type -> DLDataType
// ---------------------------------------------------------------------------------------------

/// `dl_dtype<T>::value` is the DLDataType (lanes = 1) of element type T. Specialised for float,
/// double, int8/16/32/64, uint8/16/32/64, bool and (with CUDA headers) fp16, bf16, fp8 e4m3fn,
/// fp8 e5m2. Unsupported types fail to compile. Specialise it to add a type.
template <typename T>
struct dl_dtype;

#define SGL_DEFINE_DL_DTYPE(TYPE, CODE, BITS)                                                     \
  template <>                                                                                     \
  struct dl_dtype<TYPE> {                                                                         \
    static constexpr DLDataType value{static_cast<uint8_t>(CODE), static_cast<uint8_t>(BITS), 1}; \
  }

SGL_DEFINE_DL_DTYPE(float, kDLFloat, 32);
SGL_DEFINE_DL_DTYPE(double, kDLFloat, 64);
SGL_DEFINE_DL_DTYPE(int8_t, kDLInt, 8);
SGL_DEFINE_DL_DTYPE(int16_t, kDLInt, 16);
SGL_DEFINE_DL_DTYPE(int32_t, kDLInt, 32);
SGL_DEFINE_DL_DTYPE(int64_t, kDLInt, 64);
SGL_DEFINE_DL_DTYPE(uint8_t, kDLUInt, 8);
SGL_DEFINE_DL_DTYPE(uint16_t, kDLUInt, 16);
SGL_DEFINE_DL_DTYPE(uint32_t, kDLUInt, 32);
SGL_DEFINE_DL_DTYPE(uint64_t, kDLUInt, 64);
SGL_DEFINE_DL_DTYPE(bool, kDLBool, 8);
#if SGL_TENSOR_HAS_CUDA_TYPES
SGL_DEFINE_DL_DTYPE(__half, kDLFloat, 16);
SGL_DEFINE_DL_DTYPE(__nv_bfloat16, kDLBfloat, 16);
SGL_DEFINE_DL_DTYPE(__nv_fp8_e4m3, kDLFloat8_e4m3fn, 8);
SGL_DEFINE_DL_DTYPE(__nv_fp8_e5m2, kDLFloat8_e5m2, 8);
#endif
#undef SGL_DEFINE_DL_DTYPE

/// DLDataType of element type T (cv-qualifiers ignored). Example: dl_dtype_v<bf16_t> == {kDLBfloat, 16, 1}.
template <typename T>
inline constexpr DLDataType dl_dtype_v = dl_dtype<std::remove_cv_t<T>>::value;

/// Field-wise DLDataType equality (code, bits, lanes).
[[nodiscard]] constexpr bool dtype_equal(DLDataType a, DLDataType b) noexcept {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/// Short device-type name used in error messages ("cpu", "cuda", "cuda_host", ...).
[[nodiscard]] inline const char* device_type_name(int32_t device_type) noexcept {
  switch (device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLCUDAManaged:
      return "cuda_managed";
    case kDLROCM:
      return "rocm";
    case kDLROCMHost:
      return "rocm_host";
    case kDLOpenCL:
      return "opencl";
    case kDLVulkan:
      return "vulkan";
    case kDLMetal:
      return "metal";
    case kDLOneAPI:
      return "oneapi";
    case kDLWebGPU:
      return "webgpu";
    default:
      return "unknown_device";
  }
}

/// Address of a tensor's first element as T*: `data_ptr() + byte_offset()`.
/// (For PyTorch tensors byte_offset() is 0 and data_ptr() already includes the storage offset.)
template <typename T = void>
[[nodiscard]] inline T* data_ptr(const tvm::ffi::TensorView& view) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return static_cast<T*>(static_cast<std::conditional_t<std::is_const_v<T>, const void*, void*>>(
      static_cast<Byte*>(view.data_ptr()) + view.byte_offset()));
}

// ---------------------------------------------------------------------------------------------
// Symbolic values
// ---------------------------------------------------------------------------------------------

/// A named integer (a size or a stride) shared between tensors: unbound until set_value() or the
/// first TensorMatcher::verify that uses it, after which every use must equal the bound value.
///
/// Construct as `SymbolicSize N{"num_tokens"};` — the name must outlive the object (a string
/// literal). unwrap() throws PanicError if the value was never bound.
class SymbolicSize {
 public:
  SymbolicSize(const char* name = "") : name_(name) {}

  /// Binds the value (overwrites any previous binding).
  void set_value(int64_t value) { value_ = value; }
  [[nodiscard]] bool has_value() const { return value_.has_value(); }
  [[nodiscard]] std::string_view name() const { return name_; }

  /// The bound value; throws PanicError (at the caller's file:line) if unbound.
  [[nodiscard]] int64_t unwrap(std::source_location loc = std::source_location::current()) const {
    if (!value_.has_value()) [[unlikely]] {
      detail::panic_at(loc, "SymbolicSize '", name_, "' has no value (not bound by set_value or verify)");
    }
    return *value_;
  }

 private:
  std::string_view name_;
  std::optional<int64_t> value_;
};

/// A dtype shared between tensors: optionally restricted to a set of options (set_options<Ts...>),
/// unbound until set_value() or the first verify, after which every use must equal it.
class SymbolicDType {
 public:
  static constexpr std::size_t kMaxOptions = 16;

  /// Restricts the allowed dtypes to the DLDataTypes of C++ types Ts (replaces earlier options).
  template <typename... Ts>
  SymbolicDType& set_options() {
    static_assert(sizeof...(Ts) >= 1 && sizeof...(Ts) <= kMaxOptions, "1..16 dtype options");
    num_options_ = 0;
    ((options_[num_options_++] = dl_dtype_v<Ts>), ...);
    return *this;
  }

  /// Binds the dtype (does not check the options).
  void set_value(DLDataType dtype) { value_ = dtype; }
  [[nodiscard]] bool has_value() const { return value_.has_value(); }

  /// The bound dtype; throws PanicError if unbound.
  [[nodiscard]] DLDataType unwrap(std::source_location loc = std::source_location::current()) const {
    if (!value_.has_value()) [[unlikely]] {
      detail::panic_at(loc, "SymbolicDType has no value (not bound by set_value or verify)");
    }
    return *value_;
  }

  /// True iff bound and equal to dl_dtype_v<T>. Use it to dispatch on the bound dtype.
  template <typename T>
  [[nodiscard]] bool is_type() const {
    return value_.has_value() && dtype_equal(*value_, dl_dtype_v<T>);
  }

  /// Checks `dtype` against the binding (or the options when unbound) and binds it.
  /// Returns false on mismatch; `describe_expected` then explains what was allowed.
  [[nodiscard]] bool match(DLDataType dtype) {
    if (value_.has_value()) return dtype_equal(*value_, dtype);
    if (num_options_ != 0) {
      bool found = false;
      for (std::size_t i = 0; i < num_options_; ++i) found = found || dtype_equal(options_[i], dtype);
      if (!found) return false;
    }
    value_ = dtype;
    return true;
  }

  /// Writes "float16" / "one of [bfloat16, float16]" / "any" for error messages.
  void describe_expected(std::ostream& os) const {
    if (value_.has_value()) {
      os << tvm::ffi::DLDataTypeToString(*value_);
    } else if (num_options_ == 1) {
      os << tvm::ffi::DLDataTypeToString(options_[0]);
    } else if (num_options_ > 1) {
      os << "one of [";
      for (std::size_t i = 0; i < num_options_; ++i) {
        os << (i ? ", " : "") << tvm::ffi::DLDataTypeToString(options_[i]);
      }
      os << ']';
    } else {
      os << "any";
    }
  }

 private:
  std::array<DLDataType, kMaxOptions> options_{};
  std::size_t num_options_ = 0;
  std::optional<DLDataType> value_;
};

class PendingDeviceVerify;
class TensorMatcher;

/// A device shared between tensors: optionally restricted to device types (set_options<kDLCUDA>()),
/// unbound until set_value() or the first verify, after which every use must equal it (type and id).
class SymbolicDevice {
 public:
  static constexpr std::size_t kMaxOptions = 8;

  /// Restricts the allowed device types (replaces earlier options).
  template <DLDeviceType... kTypes>
  SymbolicDevice& set_options() {
    static_assert(sizeof...(kTypes) >= 1 && sizeof...(kTypes) <= kMaxOptions, "1..8 device options");
    num_options_ = 0;
    ((options_[num_options_++] = kTypes), ...);
    return *this;
  }

  /// Restricts the allowed device types to the single runtime value `type`.
  SymbolicDevice& set_value_options(DLDeviceType type) {
    options_[0] = type;
    num_options_ = 1;
    return *this;
  }

  /// Binds the device (does not check the options).
  void set_value(DLDevice device) { value_ = device; }
  [[nodiscard]] bool has_value() const { return value_.has_value(); }

  /// The bound device; throws PanicError if unbound.
  [[nodiscard]] DLDevice unwrap(std::source_location loc = std::source_location::current()) const {
    if (!value_.has_value()) [[unlikely]] {
      detail::panic_at(loc, "SymbolicDevice has no value (not bound by set_value or verify)");
    }
    return *value_;
  }

  /// True iff `device_type` is allowed (no options = everything allowed).
  [[nodiscard]] bool allows(DLDeviceType device_type) const {
    if (num_options_ == 0) return true;
    for (std::size_t i = 0; i < num_options_; ++i) {
      if (options_[i] == device_type) return true;
    }
    return false;
  }

  /// Checks `device` against the binding (or the options when unbound) and binds it.
  [[nodiscard]] bool match(DLDevice device) {
    if (value_.has_value()) return value_->device_type == device.device_type && value_->device_id == device.device_id;
    if (!allows(device.device_type)) return false;
    value_ = device;
    return true;
  }

  /// Records `view` for `TensorMatcher::with_device<kType>(device).verify(a).verify(b)`; the
  /// matcher's `>` then runs its full checks (this device included) on each recorded tensor, in
  /// order (see DeviceClause). Nothing is checked here, so the result must not be discarded.
  [[nodiscard]] PendingDeviceVerify verify(
      const tvm::ffi::TensorView& view,
      const char* name = nullptr,
      std::source_location loc = std::source_location::current());

  /// Writes "cuda:0" (bound) / "cuda" / "one of [cuda, cpu]" / "any" for error messages.
  void describe_expected(std::ostream& os) const {
    if (value_.has_value()) {
      os << device_type_name(value_->device_type) << ':' << value_->device_id;
    } else if (num_options_ == 1) {
      os << device_type_name(options_[0]);
    } else if (num_options_ > 1) {
      os << "one of [";
      for (std::size_t i = 0; i < num_options_; ++i) os << (i ? ", " : "") << device_type_name(options_[i]);
      os << ']';
    } else {
      os << "any";
    }
  }

 private:
  std::array<DLDeviceType, kMaxOptions> options_{};
  std::size_t num_options_ = 0;
  std::optional<DLDevice> value_;
};

/// Tensors recorded by `SymbolicDevice::verify(...).verify(...)` (not yet checked); the
/// `TensorMatcher::with_device<kType>(device)` clause runs its full checks on them (see DeviceClause).
/// At most kMaxTensors tensors.
class PendingDeviceVerify {
 public:
  static constexpr std::size_t kMaxTensors = 8;

  explicit PendingDeviceVerify(SymbolicDevice& device) : device_(&device) {}

  /// Records `view` (labelled `name` in errors) for the matcher; returns *this.
  PendingDeviceVerify& verify(
      const tvm::ffi::TensorView& view,
      const char* name = nullptr,
      std::source_location loc = std::source_location::current()) {
    record(view, name, loc);
    return *this;
  }

  [[nodiscard]] SymbolicDevice& device() const { return *device_; }
  [[nodiscard]] std::size_t size() const { return num_tensors_; }
  [[nodiscard]] const tvm::ffi::TensorView& view(std::size_t i) const { return *views_[i]; }
  [[nodiscard]] const char* name(std::size_t i) const { return names_[i]; }
  [[nodiscard]] const std::source_location& location(std::size_t i) const { return locations_[i]; }

 private:
  friend class SymbolicDevice;
  void record(const tvm::ffi::TensorView& view, const char* name, const std::source_location& loc) {
    if (num_tensors_ == kMaxTensors) [[unlikely]] {
      detail::panic_at(loc, "SymbolicDevice::verify chain supports at most ", kMaxTensors, " tensors");
    }
    views_[num_tensors_].emplace(view);
    names_[num_tensors_] = name;
    locations_[num_tensors_] = loc;
    ++num_tensors_;
  }

  SymbolicDevice* device_;
  std::array<std::optional<tvm::ffi::TensorView>, kMaxTensors> views_{};
  std::array<const char*, kMaxTensors> names_{};
  std::array<std::source_location, kMaxTensors> locations_{};
  std::size_t num_tensors_ = 0;
};

inline PendingDeviceVerify SymbolicDevice::verify(
    const tvm::ffi::TensorView& view, const char* name, std::source_location loc) {
  PendingDeviceVerify pending(*this);
  pending.record(view, name, loc);
  return pending;
}

/// Wildcard entry for TensorMatcher shapes / strides: any value is accepted.
inline constexpr int64_t kAnySize = -1;

/// One entry of a TensorMatcher shape or stride list: a literal (>= 0, must match exactly),
/// -1 / kAnySize (anything), or a reference to a caller-owned SymbolicSize (binds, then must match).
class SizeRef {
 public:
  SizeRef(SymbolicSize& symbol) : symbol_(&symbol) {}
  template <std::integral I>
  SizeRef(I value) : value_(static_cast<int64_t>(value)) {}
  SizeRef() = default;

  [[nodiscard]] SymbolicSize* symbol() const { return symbol_; }
  [[nodiscard]] int64_t value() const { return value_; }
  [[nodiscard]] bool is_any() const { return symbol_ == nullptr && value_ < 0; }

 private:
  SymbolicSize* symbol_ = nullptr;
  int64_t value_ = kAnySize;
};

/// The `with_device` member of TensorMatcher.
///
/// Why it is an object and not a member function template: the tutorial's launchers write
///   TensorMatcher({N}).with_dtype<T>().with_device<kDLCUDA>(device_).verify(dst).verify(src);
/// inside a function template. `.with_dtype<T>()` is type-dependent there, and C++20 then parses
/// `.with_device<` as less-than unless one writes `.template with_device<`. So `with_device` is an
/// object whose operators give that parse the intended meaning:
///   (matcher.with_device < kDLCUDA) > device_.verify(dst).verify(src)
/// `device_.verify(...)` only records the tensors; the `>` then applies "device type kDLCUDA,
/// shared symbolic device_" to the matcher and runs the matcher's full verify on every recorded
/// tensor, in order (so errors and "tensor #k" names are the same as for a plain verify chain). The same code works outside templates.
/// Forms:
///   .with_device<kType>(device).verify(a)[.verify(b)...]   one device type (the tutorial form)
///   .with_device<kType>(device)                            configure only (on a named matcher)
///   .with_device(device)                                   device's own options; returns the matcher
///   .with_device_types<kA, kB>(device)                     several device types; returns the matcher
/// Constraint: after `.with_device<kType>(device)` only `.verify(...)` calls may follow in the chain.
class DeviceClause {
 public:
  /// Result of `with_device < kType`; completed by `> device` or `> device.verify(...)...`.
  struct Typed {
    TensorMatcher* owner;
    DLDeviceType type;
  };

  explicit DeviceClause(TensorMatcher* owner) : owner_(owner) {}
  DeviceClause(const DeviceClause&) = delete;
  DeviceClause& operator=(const DeviceClause&) = delete;

  /// `.with_device(device)`: bind/compare against `device` (its own options apply).
  TensorMatcher& operator()(SymbolicDevice& device) const;

  /// First half of `.with_device<kType>(...)`.
  Typed operator<(DLDeviceType type) const { return Typed{owner_, type}; }

 private:
  TensorMatcher* owner_;
};

/// Second half of `.with_device<kType>(device)`: configures the matcher; returns it.
TensorMatcher& operator>(DeviceClause::Typed clause, SymbolicDevice& device);
/// Second half of `.with_device<kType>(device).verify(a)...`: configures, then verifies each tensor.
TensorMatcher& operator>(DeviceClause::Typed clause, const PendingDeviceVerify& pending);

/// Fluent tensor checker. Typical use (all Symbolic* objects live in the caller):
///
///   SymbolicSize N{"num_tokens"}, D{"hidden_size"};
///   SymbolicDevice device;
///   TensorMatcher({N, D}).with_dtype<bf16_t, fp16_t>().with_device<kDLCUDA>(device).verify(x, "x").verify(out, "out");
///
/// - shape: one SizeRef per dimension (ndim must match). Literal, -1 (any), or SymbolicSize&.
/// - with_strides({...}): one SizeRef per dimension, checked exactly. Without it the tensor must be
///   contiguous (row-major; strides of size-1 dims and of empty tensors are ignored, as in torch).
/// - with_dtype<Ts...>() allows those element types; with_dtype(SymbolicDType&) shares a symbolic.
///   Either way the first verified tensor binds the dtype and later ones must have the same dtype.
///   Without with_dtype the dtype is not checked.
/// - with_device<kType>(SymbolicDevice&) restricts the device type and binds/shares the device
///   (see DeviceClause for the forms and why it is an object). All tensors verified by one matcher
///   must then be on the same device (type and id). Without with_device the device is not checked.
/// - verify(view[, name]) runs the checks in the order dtype, device, ndim, shape, strides, binding
///   symbols as it goes; on failure throws PanicError like
///   "src: dim 1 (hidden_size) expected 4096, got 4095 (shape [8, 4095]) [at file.cuh:42]".
///   The default name is "tensor #k", k = 0-based count of verify calls on this matcher.
///   Returns *this so checks chain; a matcher may be a temporary or a named object (copyable: it
///   holds pointers only to the caller's Symbolic* objects).
/// Limits: at most kMaxDims (8) dimensions.
class TensorMatcher {
 public:
  friend class DeviceClause;
  friend TensorMatcher& operator>(DeviceClause::Typed, SymbolicDevice&);
  friend TensorMatcher& operator>(DeviceClause::Typed, const PendingDeviceVerify&);

  static constexpr std::size_t kMaxDims = 8;

  TensorMatcher(std::initializer_list<SizeRef> shape, std::source_location loc = std::source_location::current()) {
    if (shape.size() > kMaxDims) [[unlikely]] {
      detail::panic_at(loc, "TensorMatcher supports at most ", kMaxDims, " dims, got ", shape.size());
    }
    ndim_ = shape.size();
    std::size_t i = 0;
    for (const SizeRef& s : shape) shape_[i++] = s;
  }

  /// Requires the element type to be one of Ts (DLDataTypes from dl_dtype_v).
  template <typename... Ts>
  TensorMatcher& with_dtype() {
    own_dtype_.set_options<Ts...>();
    external_dtype_ = nullptr;
    has_dtype_check_ = true;
    return *this;
  }

  /// Shares `dtype` (options and binding) with this matcher.
  TensorMatcher& with_dtype(SymbolicDType& dtype) {
    external_dtype_ = &dtype;
    has_dtype_check_ = true;
    return *this;
  }

  /// Device clause, used as `.with_device<kDLCUDA>(device)` or `.with_device(device)`; see DeviceClause.
  DeviceClause with_device{this};

  /// Restricts device types to kTypes and shares `device` (binding it on first verify). This is
  /// the member-function spelling of `with_device<kType>(device)`, usable with several types.
  template <DLDeviceType... kTypes>
  TensorMatcher& with_device_types(SymbolicDevice& device) {
    set_device_types<kTypes...>();
    external_device_ = &device;
    return *this;
  }

  TensorMatcher(const TensorMatcher& other)
      : shape_(other.shape_),
        strides_(other.strides_),
        ndim_(other.ndim_),
        has_strides_(other.has_strides_),
        has_dtype_check_(other.has_dtype_check_),
        has_device_check_(other.has_device_check_),
        num_verified_(other.num_verified_),
        own_dtype_(other.own_dtype_),
        external_dtype_(other.external_dtype_),
        device_types_(other.device_types_),
        external_device_(other.external_device_) {}
  TensorMatcher& operator=(const TensorMatcher&) = delete;

  /// Expected strides (in elements), one per dimension; replaces the default contiguity check.
  TensorMatcher& with_strides(
      std::initializer_list<SizeRef> strides, std::source_location loc = std::source_location::current()) {
    if (strides.size() != ndim_) [[unlikely]] {
      detail::panic_at(loc, "TensorMatcher::with_strides: got ", strides.size(), " strides for ", ndim_, " dims");
    }
    std::size_t i = 0;
    for (const SizeRef& s : strides) strides_[i++] = s;
    has_strides_ = true;
    return *this;
  }

  /// Checks `view` (see class comment); `name` labels it in errors. Throws PanicError on mismatch.
  TensorMatcher& verify(
      const tvm::ffi::TensorView& view,
      const char* name = nullptr,
      std::source_location loc = std::source_location::current()) {
    const std::size_t index = num_verified_++;
    check_dtype(view, name, index, loc);
    check_device(view, name, index, loc);
    const int64_t ndim = view.ndim();
    if (ndim != static_cast<int64_t>(ndim_)) [[unlikely]] {
      fail(view, name, index, loc, "ndim expected ", ndim_, ", got ", ndim);
    }
    const int64_t* shape = view.shape().data();
    for (std::size_t d = 0; d < ndim_; ++d) {
      check_entry(view, name, index, loc, "dim", d, shape_[d], shape[d]);
    }
    check_strides(view, name, index, loc);
    return *this;
  }

 private:
  template <DLDeviceType... kTypes>
  void set_device_types() {
    if constexpr (sizeof...(kTypes) > 0) {
      device_types_.set_options<kTypes...>();
    }
    has_device_check_ = true;
  }

  struct TensorName {
    const char* name;
    std::size_t index;
    friend std::ostream& operator<<(std::ostream& os, const TensorName& n) {
      if (n.name != nullptr) return os << n.name;
      return os << "tensor #" << n.index;
    }
  };

  struct ShapeString {
    const tvm::ffi::TensorView* view;
    bool strides;
    friend std::ostream& operator<<(std::ostream& os, const ShapeString& s) {
      const int64_t ndim = s.view->ndim();
      const int64_t* data = s.strides ? s.view->strides().data() : s.view->shape().data();
      os << '[';
      for (int64_t i = 0; i < ndim; ++i) os << (i ? ", " : "") << data[i];
      return os << ']';
    }
  };

  template <typename... Args>
  [[noreturn]] static void fail(
      const tvm::ffi::TensorView& view,
      const char* name,
      std::size_t index,
      const std::source_location& loc,
      Args&&... args) {
    detail::panic_at(
        loc,
        TensorName{name, index},
        ": ",
        std::forward<Args>(args)...,
        " (shape ",
        ShapeString{&view, false},
        ", dtype ",
        tvm::ffi::DLDataTypeToString(view.dtype()),
        ", device ",
        device_type_name(view.device().device_type),
        ':',
        view.device().device_id,
        ')');
  }

  void check_dtype(
      const tvm::ffi::TensorView& view, const char* name, std::size_t index, const std::source_location& loc) {
    if (!has_dtype_check_) return;
    SymbolicDType& dtype = external_dtype_ != nullptr ? *external_dtype_ : own_dtype_;
    if (!dtype.match(view.dtype())) [[unlikely]] {
      fail_dtype(view, name, index, loc, dtype);
    }
  }

  [[noreturn]] static void fail_dtype(
      const tvm::ffi::TensorView& view,
      const char* name,
      std::size_t index,
      const std::source_location& loc,
      const SymbolicDType& expected) {
    std::ostringstream os;
    expected.describe_expected(os);
    fail(view, name, index, loc, "dtype expected ", os.str(), ", got ", tvm::ffi::DLDataTypeToString(view.dtype()));
  }

  void check_device(
      const tvm::ffi::TensorView& view, const char* name, std::size_t index, const std::source_location& loc) {
    if (!has_device_check_) return;
    const DLDevice device = view.device();
    if (!device_types_.match(device)) [[unlikely]] {
      fail_device(view, name, index, loc, device_types_);
    }
    if (external_device_ != nullptr && !external_device_->match(device)) [[unlikely]] {
      fail_device(view, name, index, loc, *external_device_);
    }
  }

  [[noreturn]] static void fail_device(
      const tvm::ffi::TensorView& view,
      const char* name,
      std::size_t index,
      const std::source_location& loc,
      const SymbolicDevice& expected) {
    std::ostringstream os;
    expected.describe_expected(os);
    fail(
        view,
        name,
        index,
        loc,
        "device expected ",
        os.str(),
        ", got ",
        device_type_name(view.device().device_type),
        ':',
        view.device().device_id);
  }

  static void check_entry(
      const tvm::ffi::TensorView& view,
      const char* name,
      std::size_t index,
      const std::source_location& loc,
      const char* what,
      std::size_t d,
      const SizeRef& expected,
      int64_t actual) {
    if (SymbolicSize* symbol = expected.symbol()) {
      if (!symbol->has_value()) {
        symbol->set_value(actual);
      } else if (symbol->unwrap() != actual) [[unlikely]] {
        fail(
            view,
            name,
            index,
            loc,
            what,
            ' ',
            d,
            " (",
            symbol->name(),
            ") expected ",
            symbol->unwrap(),
            ", got ",
            actual);
      }
    } else if (!expected.is_any() && expected.value() != actual) [[unlikely]] {
      fail(view, name, index, loc, what, ' ', d, " expected ", expected.value(), ", got ", actual);
    }
  }

  void check_strides(
      const tvm::ffi::TensorView& view, const char* name, std::size_t index, const std::source_location& loc) const {
    if (ndim_ == 0) return;
    // TVM-FFI fills strides for every tensor it imports (DLPack null strides become compact ones).
    const int64_t* shape = view.shape().data();
    const int64_t* strides = view.strides().data();
    if (has_strides_) {
      for (std::size_t d = 0; d < ndim_; ++d) check_entry(view, name, index, loc, "stride", d, strides_[d], strides[d]);
      return;
    }
    for (std::size_t d = 0; d < ndim_; ++d) {
      if (shape[d] == 0) return;  // empty tensors are contiguous
    }
    int64_t expected_stride = 1;
    for (std::size_t d = ndim_; d-- > 0;) {
      if (shape[d] != 1 && strides[d] != expected_stride) [[unlikely]] {
        fail(
            view,
            name,
            index,
            loc,
            "expected contiguous strides, got strides ",
            ShapeString{&view, true},
            " (dim ",
            d,
            " has stride ",
            strides[d],
            ", expected ",
            expected_stride,
            ")");
      }
      expected_stride *= shape[d];
    }
  }

  std::array<SizeRef, kMaxDims> shape_{};
  std::array<SizeRef, kMaxDims> strides_{};
  std::size_t ndim_ = 0;
  bool has_strides_ = false;
  bool has_dtype_check_ = false;
  bool has_device_check_ = false;
  std::size_t num_verified_ = 0;
  SymbolicDType own_dtype_;                  // options from with_dtype<Ts...>()
  SymbolicDType* external_dtype_ = nullptr;  // from with_dtype(SymbolicDType&)
  SymbolicDevice device_types_;              // options from with_device<kTypes...>()
  SymbolicDevice* external_device_ = nullptr;
};

inline TensorMatcher& DeviceClause::operator()(SymbolicDevice& device) const {
  owner_->set_device_types<>();
  owner_->external_device_ = &device;
  return *owner_;
}

inline TensorMatcher& operator>(DeviceClause::Typed clause, SymbolicDevice& device) {
  TensorMatcher& matcher = *clause.owner;
  matcher.device_types_.set_value_options(clause.type);
  matcher.has_device_check_ = true;
  matcher.external_device_ = &device;
  return matcher;
}

inline TensorMatcher& operator>(DeviceClause::Typed clause, const PendingDeviceVerify& pending) {
  TensorMatcher& matcher = clause > pending.device();
  for (std::size_t i = 0; i < pending.size(); ++i) {
    matcher.verify(pending.view(i), pending.name(i), pending.location(i));
  }
  return matcher;
}

// ---------------------------------------------------------------------------------------------
// Memory overlap between tensors (what the shape/dtype/device checks above cannot see)
// ---------------------------------------------------------------------------------------------

/// Byte range [first, last) spanned by `view`'s elements (empty tensors: first == last).
struct ByteSpan {
  uint64_t first;
  uint64_t last;
};

/// The bytes `view` can touch: from its lowest to one past its highest element address.
[[nodiscard]] inline ByteSpan byte_span(const tvm::ffi::TensorView& view) {
  const uint64_t base = reinterpret_cast<uint64_t>(data_ptr(view));
  const int64_t item = (static_cast<int64_t>(view.dtype().bits) * view.dtype().lanes + 7) / 8;
  int64_t low = 0, high = 0;  // element offsets
  for (int32_t d = 0; d < view.ndim(); ++d) {
    const int64_t size = view.shape()[d];
    if (size == 0) return {base, base};
    const int64_t step = (size - 1) * view.strides()[d];
    (step < 0 ? low : high) += step;
  }
  return {base + static_cast<uint64_t>(low * item), base + static_cast<uint64_t>((high + 1) * item)};
}

namespace detail {

/// The bytes a view covers, as a product of dims: each dim of size > 1 and stride != 0 (a stride-0
/// dim repeats addresses, it adds none) with its stride in bytes made positive (`base` moved to the
/// lowest element), sorted by ascending stride, a dim folded into the previous one where it
/// continues it (stride == size * stride of the previous). `reason` is set when the exact overlap
/// check cannot use the layout: a sub-byte dtype, more than kMaxDims such dims, or dims that
/// interleave (a stride below the extent of the smaller dims).
/// Example: bf16 q = qkv[:, :512].view(T, 4, 128) of a [T, 1536] buffer, T > 1 ->
/// dims {size 512, stride 2}, {size T, stride 3072}; span (T - 1) * 3072 + 1024.
struct ByteDims {
  static constexpr int32_t kMaxDims = 8;
  int64_t base = 0;  // byte address of the lowest element
  int64_t item = 0;  // bytes per element
  int64_t span = 0;  // bytes from base to one past the last byte of the highest element
  int32_t ndim = 0;
  // Entries past ndim stay uninitialised: zeroing them costs a third of the warm check.
  std::array<int64_t, kMaxDims> size;    // [ndim]
  std::array<int64_t, kMaxDims> stride;  // [ndim], bytes, ascending
  const char* reason = nullptr;
};

/// ByteDims of a non-empty view (see ByteDims).
[[nodiscard]] inline ByteDims byte_dims(const tvm::ffi::TensorView& view) {
  ByteDims dims;
  const int64_t bits = static_cast<int64_t>(view.dtype().bits) * view.dtype().lanes;
  dims.item = bits / 8;
  dims.base = static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(data_ptr(view)));
  if (bits == 0 || bits % 8 != 0) {
    dims.reason = "a sub-byte dtype";
    return dims;
  }
  for (int32_t d = 0; d < view.ndim(); ++d) {
    const int64_t size = view.shape()[d];
    int64_t stride = view.strides()[d] * dims.item;
    if (size <= 1 || stride == 0) continue;
    if (stride < 0) {  // same addresses walked from the other end
      dims.base += (size - 1) * stride;
      stride = -stride;
    }
    if (dims.ndim == ByteDims::kMaxDims) {
      dims.reason = "more than 8 dims of size > 1";
      return dims;
    }
    int32_t k = dims.ndim++;
    for (; k > 0 && dims.stride[k - 1] > stride; --k) {  // insertion sort by stride
      dims.size[k] = dims.size[k - 1];
      dims.stride[k] = dims.stride[k - 1];
    }
    dims.size[k] = size;
    dims.stride[k] = stride;
  }
  int32_t n = 0;
  for (int32_t k = 0; k < dims.ndim; ++k) {
    if (n > 0 && dims.stride[k] == dims.size[n - 1] * dims.stride[n - 1]) {
      dims.size[n - 1] *= dims.size[k];
      continue;
    }
    dims.size[n] = dims.size[k];
    dims.stride[n] = dims.stride[k];
    ++n;
  }
  dims.ndim = n;
  dims.span = dims.item;
  for (int32_t k = 0; k < n; ++k) {
    if (dims.stride[k] < dims.span && dims.reason == nullptr) dims.reason = "dims that interleave";
    dims.span += (dims.size[k] - 1) * dims.stride[k];
  }
  return dims;
}

/// Walks, in ascending order, the byte runs [begin(), end()) covered by dims [0, ndim) of a ByteDims
/// without a `reason` (its dims nest, so the odometer order is sorted), shifted by `shift`: a
/// contiguous innermost dim is one run, otherwise each element is one.
/// Example: bf16 dims {size 4, stride 2}, {size 3, stride 16}, ndim 2, shift 0 ->
/// [0, 8), [16, 24), [32, 40).
class RunWalk {
 public:
  RunWalk(const ByteDims& dims, int32_t ndim, int64_t shift)
      : dims_(&dims), ndim_(ndim), begin_(shift), run_(dims.item) {
    if (ndim > 0 && dims.stride[0] == dims.item) {
      run_ = dims.size[0] * dims.item;
      first_ = 1;
    }
  }

  /// Number of runs of the walk, or `cap` + 1 when there are more than `cap`.
  [[nodiscard]] int64_t num_runs(int64_t cap) const {
    int64_t count = 1;
    for (int32_t d = first_; d < ndim_; ++d) {
      if (count > cap / dims_->size[d]) return cap + 1;
      count *= dims_->size[d];
    }
    return count;
  }

  [[nodiscard]] bool done() const { return done_; }
  [[nodiscard]] int64_t begin() const { return begin_; }
  [[nodiscard]] int64_t end() const { return begin_ + run_; }

  void next() {
    for (int32_t d = first_; d < ndim_; ++d) {
      begin_ += dims_->stride[d];
      if (++index_[d] < dims_->size[d]) return;
      begin_ -= dims_->size[d] * dims_->stride[d];
      index_[d] = 0;
    }
    done_ = true;
  }

 private:
  const ByteDims* dims_;
  int32_t ndim_;
  int32_t first_ = 0;
  int64_t begin_;
  int64_t run_;
  bool done_ = false;
  std::array<int64_t, ByteDims::kMaxDims> index_{};
};

/// Whether two sorted run walks share a byte: a linear merge.
[[nodiscard]] inline bool runs_intersect(RunWalk a, RunWalk b) {
  while (!a.done() && !b.done()) {
    if (a.end() <= b.begin()) {
      a.next();
    } else if (b.end() <= a.begin()) {
      b.next();
    } else {
      return true;
    }
  }
  return false;
}

/// Most runs per row the exact overlap check walks before it gives up (a few hundred µs at most).
inline constexpr int64_t kMaxRunsPerRow = int64_t{1} << 16;

enum class Sharing { kDisjoint, kShared, kUndecided };

/// Whether the bytes of `a` and `b` (both without a `reason`) intersect, decided by rows. Each view
/// is rows along its largest-stride dim (T rows at stride s) of the same byte runs, which lie in
/// [0, s) because the dims nest; a view that fits in one row of the other is a single row. With a
/// common s and delta = b.base - a.base = m * s + r (0 <= r < s), row i of a meets row j of b only
/// when i == m + j (runs of a against runs of b shifted by r) or i == m + j + 1 (shifted by r - s):
/// shared iff (-Tb < m < Ta and the first merge meets) or (-Tb < m + 1 < Ta and the second does).
/// kUndecided (with `reason`) when the row strides differ or a row has more than kMaxRunsPerRow runs.
/// Example: bf16 [T, 6, 128] buffer x, a = x[:, 0:4], b = x[:, 3:5]: s = 1536, m = 0, r = 768,
/// runs [0, 1024) and [768, 1280) -> kShared; b = x[:, 4:6]: r = 1024 -> kDisjoint.
[[nodiscard]] inline Sharing byte_sharing(const ByteDims& a, const ByteDims& b, const char** reason) {
  const int64_t sa = a.ndim > 0 ? a.stride[a.ndim - 1] : 0;
  const int64_t sb = b.ndim > 0 ? b.stride[b.ndim - 1] : 0;
  int64_t s = 0, ta = 1, tb = 1;
  int32_t pa = a.ndim, pb = b.ndim;                              // dims that make up one row
  const bool rows_a = a.ndim > 0 && (sa == sb || b.span <= sa);  // else a is one row
  const bool rows_b = b.ndim > 0 && (sa == sb || a.span <= sb);
  if (rows_a && rows_b) {
    s = sa;
  } else if (rows_b) {
    s = sb;  // a fits in one row of b
  } else if (rows_a) {
    s = sa;  // b fits in one row of a
  } else if (a.ndim == 0 && b.ndim == 0) {
    s = a.span > b.span ? a.span : b.span;  // two single elements
  } else {
    *reason = "their row strides differ";
    return Sharing::kUndecided;
  }
  if (rows_a) {
    ta = a.size[a.ndim - 1];
    pa = a.ndim - 1;
  }
  if (rows_b) {
    tb = b.size[b.ndim - 1];
    pb = b.ndim - 1;
  }
  const RunWalk runs_a(a, pa, 0);
  if (runs_a.num_runs(kMaxRunsPerRow) > kMaxRunsPerRow || RunWalk(b, pb, 0).num_runs(kMaxRunsPerRow) > kMaxRunsPerRow) {
    *reason = "a row has more than 65536 runs";
    return Sharing::kUndecided;
  }
  const int64_t delta = b.base - a.base;
  int64_t m = delta / s, r = delta % s;
  if (r < 0) {
    r += s;
    --m;
  }
  if (-tb < m && m < ta && runs_intersect(runs_a, RunWalk(b, pb, r))) return Sharing::kShared;
  if (-tb < m + 1 && m + 1 < ta && runs_intersect(runs_a, RunWalk(b, pb, r - s))) return Sharing::kShared;
  return Sharing::kDisjoint;
}

}  // namespace detail

namespace detail {

/// A byte span as the overlap messages print it: "[0x7f0000, 0x7f0400)".
inline std::string span_text(const ByteSpan& span) {
  std::ostringstream os;
  os << std::hex << "[0x" << span.first << ", 0x" << span.last << ')';
  return os.str();
}

}  // namespace detail

/// Throws PanicError unless `a` and `b` share no byte or (when `allow_same`) are exactly the same
/// view (same address, shape and strides: an in-place call). Partially overlapping operands would
/// make a kernel read elements it has already overwritten.
/// Exact for views that are rows of one stride (detail::byte_sharing): each view is rows along its
/// largest-stride dim (the token dim of [num_tokens, num_heads, head_dim] views of a fused qkv
/// buffer, the head dim of head-major buf.view(H, T, D).transpose(0, 1) views), or one row when it
/// fits in a row of the other; cost O(runs per row), O(1) for contiguous heads. Views whose byte
/// ranges intersect in a layout it cannot decide (different row strides, dims that interleave, more
/// than 65536 runs per row, sub-byte dtypes) are refused: "<a> and <b> share memory in a layout
/// whose disjointness cannot be verified (...)".
/// Messages, in the form of every argument error (`<arg> <what>: expected X, got Y`; the Python
/// wrappers prefix the op), with the byte spans [first, last) of both views:
///   "k overlaps q: expected disjoint memory, got a partial overlap (k [0x.., 0x..), q [0x.., 0x..))"
///   "out overlaps input: expected disjoint memory or the same tensor, got a partial overlap (...)"
///   "k overlaps q: expected disjoint memory, got the same tensor (k [...), q [...))"
///   "k overlaps q: expected disjoint memory (or views of one buffer with the same largest stride,
///    the token stride), got byte ranges that share memory in a layout whose disjointness cannot be
///    verified (k has dims that interleave; k [...), q [...))"
/// Examples: verify_no_partial_overlap(k, "k", q, "q", false) with q = x[:, 0:4] of x = [T, 6, D]:
/// k = x[:, 4:6] -> ok (q and k of one qkv buffer); k = x[:, 3:5] -> "k overlaps q: expected
/// disjoint memory, got a partial overlap (...)". out = y[1:] with src = y[:-1], allow_same ->
/// "out overlaps src: expected disjoint memory or the same tensor, got a partial overlap (...)".
inline void verify_no_partial_overlap(
    const tvm::ffi::TensorView& a,
    const char* a_name,
    const tvm::ffi::TensorView& b,
    const char* b_name,
    bool allow_same,
    std::source_location loc = std::source_location::current()) {
  const ByteSpan sa = byte_span(a), sb = byte_span(b);
  if (sa.first == sa.last || sb.first == sb.last) return;  // an empty tensor overlaps nothing
  if (sa.last <= sb.first || sb.last <= sa.first) return;
  bool same = data_ptr(a) == data_ptr(b) && a.ndim() == b.ndim();
  for (int32_t d = 0; same && d < a.ndim(); ++d) {
    same = a.shape()[d] == b.shape()[d] && (a.shape()[d] == 1 || a.strides()[d] == b.strides()[d]);
  }
  if (same && allow_same) return;
  const char* expected =
      allow_same ? ": expected disjoint memory or the same tensor, got " : ": expected disjoint memory, got ";
  if (same) [[unlikely]] {
    detail::panic_at(
        loc,
        a_name,
        " overlaps ",
        b_name,
        expected,
        "the same tensor (",
        a_name,
        " ",
        detail::span_text(sa),
        ", ",
        b_name,
        " ",
        detail::span_text(sb),
        ")");
  }
  const detail::ByteDims da = detail::byte_dims(a), db = detail::byte_dims(b);
  const char* reason = da.reason != nullptr ? da.reason : db.reason;
  const char* who = da.reason != nullptr ? a_name : db.reason != nullptr ? b_name : nullptr;
  detail::Sharing sharing = detail::Sharing::kUndecided;
  if (reason == nullptr) sharing = detail::byte_sharing(da, db, &reason);
  if (sharing == detail::Sharing::kDisjoint) return;
  if (sharing == detail::Sharing::kShared) [[unlikely]] {
    detail::panic_at(
        loc,
        a_name,
        " overlaps ",
        b_name,
        expected,
        "a partial overlap (",
        a_name,
        " ",
        detail::span_text(sa),
        ", ",
        b_name,
        " ",
        detail::span_text(sb),
        ")");
  }
  detail::panic_at(
      loc,
      a_name,
      " overlaps ",
      b_name,
      allow_same ? ": expected disjoint memory or the same tensor" : ": expected disjoint memory",
      " (or views of one buffer with the same largest stride, the token stride), got byte ranges that "
      "share memory in a layout whose disjointness cannot be verified (",
      who != nullptr ? who : "",
      who != nullptr ? " has " : "",
      reason,
      "; ",
      a_name,
      " ",
      detail::span_text(sa),
      ", ",
      b_name,
      " ",
      detail::span_text(sb),
      ")");
}

/// Throws PanicError if two elements of `view` can share an address, which an output or in-place
/// operand must not: a dim of size > 1 with stride 0 (an expanded tensor), or, with the dims of size
/// > 1 ordered by |stride|, a stride below the extent 1 + sum((size - 1) * |stride|) of the dims
/// before it (torch's rule; conservative: a few interleaved but disjoint layouts are refused too).
/// Messages (`<arg> <what>: expected X, got Y`, as verify_no_partial_overlap's):
///   "t strides: expected no dim of size > 1 with stride 0 (elements at addresses of their own), got
///    dim 0 of size 4 with stride 0 (an expanded tensor)"
///   "q strides: expected elements at addresses of their own (each stride >= the extent of the dims
///    with smaller strides), got dim 1 stride 64 < extent 128 of the dims with smaller strides"
/// Examples: [T, H, D] with strides (W, D, 1), W >= H * D (a fused qkv view), or head-major
/// (D, T * D, 1) -> ok; strides (H * 128, 64, 1) with D = 128 -> the second message.
inline void verify_no_self_overlap(
    const tvm::ffi::TensorView& view, const char* name, std::source_location loc = std::source_location::current()) {
  const int32_t ndim = view.ndim();
  const int64_t* shape = view.shape().data();
  const int64_t* strides = view.strides().data();
  bool empty = false;
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] > 1 && strides[d] == 0) [[unlikely]] {
      detail::panic_at(
          loc,
          name,
          " strides: expected no dim of size > 1 with stride 0 (elements at addresses of their own), "
          "got dim ",
          d,
          " of size ",
          shape[d],
          " with stride 0 (an expanded tensor)");
    }
    empty = empty || shape[d] == 0;
  }
  if (empty) return;
  // Dims that nest in index order (each stride >= the extent of the later dims) are the common
  // case and enough: nesting in any order rules overlap out.
  int64_t nested_extent = 1;
  bool nested = true;
  for (int32_t d = ndim; nested && d-- > 0;) {
    if (shape[d] <= 1) continue;
    const int64_t stride = strides[d] < 0 ? -strides[d] : strides[d];
    nested = stride >= nested_extent;
    nested_extent += (shape[d] - 1) * stride;
  }
  if (nested) return;
  // Otherwise, O(ndim^2) without sorting: dims before d are those of smaller |stride| (ties: lower
  // index).
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] <= 1) continue;
    const int64_t stride = strides[d] < 0 ? -strides[d] : strides[d];
    int64_t extent = 1;
    for (int32_t e = 0; e < ndim; ++e) {
      const int64_t other = strides[e] < 0 ? -strides[e] : strides[e];
      if (e != d && shape[e] > 1 && (other < stride || (other == stride && e < d))) extent += (shape[e] - 1) * other;
    }
    if (stride < extent) [[unlikely]] {
      detail::panic_at(
          loc,
          name,
          " strides: expected elements at addresses of their own (each stride >= the extent of the "
          "dims with smaller strides), got dim ",
          d,
          " stride ",
          strides[d],
          " < extent ",
          extent,
          " of the dims with smaller strides");
    }
  }
}

}  // namespace host
