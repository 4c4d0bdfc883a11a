// Host-side utilities shared by every JIT kernel launcher.
//
// Needs only the C++20 standard library and TVM-FFI (for tvm::ffi::Error); no CUDA.
//
//   host::PanicError            exception type (a tvm::ffi::Error of kind "RuntimeError")
//   host::Panic(args...)        throw a PanicError built from args, tagged with the caller's file:line
//   host::RuntimeCheck(c, ...)  throw a PanicError when c is false
//   host::div_ceil(a, b)        integer ceiling division
//   host::irange(n) / (s, e)    half-open integer ranges for range-for
//   host::pointer::offset(...)  byte-offset arithmetic on void* / const void*
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <source_location>
#include <sstream>
#include <string>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/error.h>
#include <type_traits>
#include <utility>

namespace host {

/// Exception thrown by every check in sgl_kernel.
///
/// It is a `tvm::ffi::Error` of kind "RuntimeError", so when it escapes a function exported through
/// TVM-FFI it reaches Python as a `RuntimeError`. The message ends with " [at <file>:<line>]" naming
/// the call site that failed (the caller of Panic / RuntimeCheck / TensorMatcher::verify / ...).
class PanicError : public tvm::ffi::Error {
 public:
  /// Builds the error from an already formatted `message` and the failing call site `loc`.
  PanicError(const std::string& message, const std::source_location& loc)
      : tvm::ffi::Error(
            "RuntimeError",
            FormatMessage(message, loc),
            TVMFFIBacktrace(loc.file_name(), static_cast<int>(loc.line()), loc.function_name(), 0)) {}

  /// Appends the location suffix " [at <file>:<line>]" to `message`.
  static std::string FormatMessage(const std::string& message, const std::source_location& loc) {
    std::ostringstream os;
    os << message << " [at " << loc.file_name() << ':' << loc.line() << ']';
    return os.str();
  }
};

namespace detail {

/// Streams every argument into one string (`os << arg` must be valid for each).
template <typename... Args>
[[nodiscard]] inline std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// Throws PanicError(concat(args...), loc). Kept out of line of the fast path.
template <typename... Args>
[[noreturn]] __attribute__((noinline, cold)) void panic_at(const std::source_location& loc, Args&&... args) {
  throw PanicError(concat(std::forward<Args>(args)...), loc);
}

}  // namespace detail

/// Unconditionally throws a PanicError whose message is all `args` streamed together.
///
/// Usage: `Panic("unsupported head_dim ", head_dim);` — the call site's file:line is captured via
/// std::source_location (class template + deduction guide so the variadic pack can come first).
/// Note: `Panic(msg);` with a single bare identifier parses as a declaration and fails to compile;
/// write `Panic("", msg);` or `Panic(std::string(msg));` instead.
template <typename... Args>
struct Panic {
  [[noreturn]] explicit Panic(Args&&... args, std::source_location loc = std::source_location::current()) {
    detail::panic_at(loc, std::forward<Args>(args)...);
  }
};
template <typename... Args>
Panic(Args&&...) -> Panic<Args...>;

/// Throws a PanicError when `cond` is false; otherwise does nothing (arguments are not formatted).
///
/// Usage: `RuntimeCheck(n > 0, "num_tokens must be > 0, got ", n);` The message is
/// "Runtime check failed: <args...> [at <file>:<line>]". `cond` is anything contextually
/// convertible to bool. Same single-identifier caveat as Panic: `RuntimeCheck(ok);` does not
/// compile, write `RuntimeCheck(ok == true);` or add a message.
template <typename... Args>
struct RuntimeCheck {
  template <typename Cond>
  explicit RuntimeCheck(Cond&& cond, Args&&... args, std::source_location loc = std::source_location::current()) {
    if (!static_cast<bool>(cond)) [[unlikely]] {
      detail::panic_at(loc, "Runtime check failed: ", std::forward<Args>(args)...);
    }
  }
};
template <typename Cond, typename... Args>
RuntimeCheck(Cond&&, Args&&...) -> RuntimeCheck<Args...>;

/// Ceiling division ceil(a / b) for integers, computed without the overflow of (a + b - 1) / b.
///
/// Template params: any two integral types; the result (and the arithmetic) uses their
/// std::common_type (e.g. (uint32_t, uint32_t) -> uint32_t, (int64_t, int) -> int64_t).
/// Preconditions: a >= 0 and b > 0 (not checked; b == 0 is undefined behaviour).
/// Example: div_ceil(4097, 256) == 17.
template <std::integral A, std::integral B>
[[nodiscard]] constexpr std::common_type_t<A, B> div_ceil(A a, B b) noexcept {
  using T = std::common_type_t<A, B>;
  const T x = static_cast<T>(a);
  const T y = static_cast<T>(b);
  return x / y + static_cast<T>(x % y != 0);
}

/// Half-open range [begin, end) of integers of type T, iterable with range-for and std::ranges.
/// An empty range results when end <= begin.
template <std::integral T>
class IntegerRange {
 public:
  /// Random-access-ish iterator yielding the current integer by value.
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = T;

    constexpr iterator() = default;
    constexpr explicit iterator(T value) : value_(value) {}
    constexpr T operator*() const { return value_; }
    constexpr iterator& operator++() {
      ++value_;
      return *this;
    }
    constexpr iterator operator++(int) {
      iterator old = *this;
      ++value_;
      return old;
    }
    constexpr bool operator==(const iterator&) const = default;

   private:
    T value_{};
  };

  constexpr IntegerRange(T begin, T end) : begin_(begin), end_(end < begin ? begin : end) {}
  constexpr iterator begin() const { return iterator{begin_}; }
  constexpr iterator end() const { return iterator{end_}; }
  /// Number of integers in the range.
  constexpr T size() const { return end_ - begin_; }
  constexpr bool empty() const { return begin_ == end_; }

 private:
  T begin_;
  T end_;
};

/// Range 0, 1, ..., n-1 (empty when n <= 0). Example: `for (auto i : irange(ndim)) ...`.
template <std::integral T>
[[nodiscard]] constexpr IntegerRange<T> irange(T n) {
  return IntegerRange<T>(T{0}, n);
}

/// Range start, ..., end-1 in the common type of the two arguments (empty when end <= start).
template <std::integral A, std::integral B>
[[nodiscard]] constexpr IntegerRange<std::common_type_t<A, B>> irange(A start, B end) {
  using T = std::common_type_t<A, B>;
  return IntegerRange<T>(static_cast<T>(start), static_cast<T>(end));
}

namespace pointer {

/// Returns `ptr` advanced by the sum of `offsets` in BYTES (each offset any integral type,
/// converted to int64_t; negative offsets are allowed). Example: offset(base, row * row_bytes, 16).
template <std::integral... Offsets>
[[nodiscard]] inline void* offset(void* ptr, Offsets... offsets) {
  return static_cast<char*>(ptr) + (static_cast<int64_t>(0) + ... + static_cast<int64_t>(offsets));
}

/// Const overload of offset(void*, ...): byte offset that keeps the pointer const.
template <std::integral... Offsets>
[[nodiscard]] inline const void* offset(const void* ptr, Offsets... offsets) {
  return static_cast<const char*>(ptr) + (static_cast<int64_t>(0) + ... + static_cast<int64_t>(offsets));
}

}  // namespace pointer

}  // namespace host
