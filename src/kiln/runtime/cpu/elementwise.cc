// Kiln's own elementwise loops: every unary and binary op (the fallback for the ones oneDNN also
// runs, the only implementation for the rest), compare, select, logical ops and convert. Floats
// narrower than f32 load to f32, compute, and round to nearest even on store; integers compute in
// their own type with wrap-around (via unsigned arithmetic, never undefined behaviour).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

template <typename S, typename F>
std::unique_ptr<Thunk> UnaryThunk(const ir::Node& n, F f) {
  int in = n.operand(0), out = n.id();
  int64_t count = n.type().shape.num_elements();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = Elem<S>::Store(f(Elem<S>::Load(x[i])));
    });
  });
}

// y = kernel(x) through one of the shared f32 vector kernels (ExpF32, TanhF32, GeluTanhF32: the
// fused loops call the same ones, so fused and unfused results agree bit for bit). Narrower
// floats convert through a block of f32 and round on store, as everywhere.
template <typename S>
std::unique_ptr<Thunk> VectorUnaryThunk(const ir::Node& n,
                                        void (*kernel)(const float*, float*, int64_t)) {
  int in = n.operand(0), out = n.id();
  int64_t count = n.type().shape.num_elements();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<S, float>) {
        kernel(x + b, y + b, e - b);
      } else {
        constexpr int64_t kChunk = 256;
        float buf[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t m = std::min(kChunk, e - i);
          for (int64_t j = 0; j < m; ++j) buf[j] = Elem<S>::Load(x[i + j]);
          kernel(buf, buf, m);
          for (int64_t j = 0; j < m; ++j) y[i + j] = Elem<S>::Store(buf[j]);
        }
      }
    });
  });
}

template <typename S, typename F>
std::unique_ptr<Thunk> BinaryThunk(const ir::Node& n, F f) {
  int in0 = n.operand(0), in1 = n.operand(1), out = n.id();
  int64_t count = n.type().shape.num_elements();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* a = static_cast<const S*>(ctx.buffers[in0]);
    const S* c = static_cast<const S*>(ctx.buffers[in1]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        y[i] = Elem<S>::Store(f(Elem<S>::Load(a[i]), Elem<S>::Load(c[i])));
    });
  });
}

template <typename C>
C Sigmoid(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

template <typename S>
LowerResult UnaryFloat(const ir::Node& n) {
  using C = typename Elem<S>::C;
  // f32 and narrower: exp, tanh and GELU (tanh form) run the shared vector kernels; f64 keeps libm.
  if constexpr (std::is_same_v<C, float>) {
    const bool gelu_tanh = n.opcode() == Opcode::kGelu && n.has_attr("approximate") &&
                           n.attr_str("approximate") == "tanh";
    if (n.opcode() == Opcode::kExp) return VectorUnaryThunk<S>(n, ExpF32);
    if (n.opcode() == Opcode::kTanh) return VectorUnaryThunk<S>(n, TanhF32);
    if (gelu_tanh) return VectorUnaryThunk<S>(n, GeluTanhF32);
  }
  switch (n.opcode()) {
    case Opcode::kAbs:
      return UnaryThunk<S>(n, [](C x) { return std::abs(x); });
    case Opcode::kCos:
      return UnaryThunk<S>(n, [](C x) { return std::cos(x); });
    case Opcode::kErf:
      return UnaryThunk<S>(n, [](C x) { return std::erf(x); });
    case Opcode::kExp:
      return UnaryThunk<S>(n, [](C x) { return std::exp(x); });
    case Opcode::kGelu:
      if (n.has_attr("approximate") && n.attr_str("approximate") == "tanh") {
        return UnaryThunk<S>(n, [](C x) {
          const C k = static_cast<C>(0.7978845608028654);  // sqrt(2/pi)
          return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
        });
      }
      return UnaryThunk<S>(n, [](C x) {
        return C(0.5) * x * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
      });
    case Opcode::kLog:
      return UnaryThunk<S>(n, [](C x) { return std::log(x); });
    case Opcode::kNeg:
      return UnaryThunk<S>(n, [](C x) { return -x; });
    case Opcode::kRelu:
      return UnaryThunk<S>(n, [](C x) { return std::max(x, C(0)); });
    case Opcode::kRsqrt:
      return UnaryThunk<S>(n, [](C x) { return C(1) / std::sqrt(x); });
    case Opcode::kSigmoid:
      return UnaryThunk<S>(n, [](C x) { return Sigmoid(x); });
    case Opcode::kSign:
      // sign(0) = sign(NaN) = 0, as in PyTorch.
      return UnaryThunk<S>(n, [](C x) { return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0)); });
    case Opcode::kSilu:
      return UnaryThunk<S>(n, [](C x) { return x * Sigmoid(x); });
    case Opcode::kSin:
      return UnaryThunk<S>(n, [](C x) { return std::sin(x); });
    case Opcode::kSqrt:
      return UnaryThunk<S>(n, [](C x) { return std::sqrt(x); });
    case Opcode::kTanh:
      return UnaryThunk<S>(n, [](C x) { return std::tanh(x); });
    default:
      return UnsupportedDType(n, n.type().dtype);
  }
}

template <typename T>
using Unsigned = std::make_unsigned_t<T>;

template <typename T>
LowerResult UnaryInt(const ir::Node& n) {
  switch (n.opcode()) {
    case Opcode::kAbs:
      return UnaryThunk<T>(n, [](T x) { return x < 0 ? T(Unsigned<T>(0) - Unsigned<T>(x)) : x; });
    case Opcode::kNeg:
      return UnaryThunk<T>(n, [](T x) { return T(Unsigned<T>(0) - Unsigned<T>(x)); });
    case Opcode::kSign:
      return UnaryThunk<T>(n, [](T x) { return T((x > 0) - (x < 0)); });
    case Opcode::kRelu:
      return UnaryThunk<T>(n, [](T x) { return x > 0 ? x : T(0); });
    default:
      return UnsupportedDType(n, n.type().dtype);
  }
}

// Integer division truncates toward zero; x / 0 gives -1 (all ones, as XLA) and MIN / -1 wraps
// to MIN (no trap).
template <typename T>
T IntDiv(T a, T b) {
  if (b == 0) return static_cast<T>(-1);
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return T(Unsigned<T>(0) - Unsigned<T>(a));
  }
  return a / b;
}

// Integer power by squaring (wrapping); a negative exponent gives the truncated 1 / a^|b| (1 for
// a = 1, +-1 for a = -1, -1 for a = 0 like x / 0, else 0).
template <typename T>
T IntPow(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) {
      if (a == 1) return 1;
      if (a == -1) return (b % 2 == 0) ? 1 : -1;
      return a == 0 ? -1 : 0;
    }
  }
  Unsigned<T> result = 1, base = static_cast<Unsigned<T>>(a);
  for (Unsigned<T> e = static_cast<Unsigned<T>>(b); e; e >>= 1) {
    if (e & 1) result = static_cast<Unsigned<T>>(result * base);
    base = static_cast<Unsigned<T>>(base * base);
  }
  return static_cast<T>(result);
}

template <typename S>
LowerResult BinaryFloat(const ir::Node& n) {
  using C = typename Elem<S>::C;
  switch (n.opcode()) {
    case Opcode::kAdd:
      return BinaryThunk<S>(n, [](C a, C b) { return a + b; });
    case Opcode::kSub:
      return BinaryThunk<S>(n, [](C a, C b) { return a - b; });
    case Opcode::kMul:
      return BinaryThunk<S>(n, [](C a, C b) { return a * b; });
    case Opcode::kDiv:
      return BinaryThunk<S>(n, [](C a, C b) { return a / b; });
    // ---- max ---- (NaN propagates)
    case Opcode::kMax:
      return BinaryThunk<S>(n, [](C a, C b) { return (a > b || a != a) ? a : b; });
    case Opcode::kMin:
      return BinaryThunk<S>(n, [](C a, C b) { return (a < b || a != a) ? a : b; });
    case Opcode::kPow:
      return BinaryThunk<S>(n, [](C a, C b) { return std::pow(a, b); });
    default:
      return UnsupportedDType(n, n.type().dtype);
  }
}

template <typename T>
LowerResult BinaryInt(const ir::Node& n) {
  using U = Unsigned<T>;
  switch (n.opcode()) {
    case Opcode::kAdd:
      return BinaryThunk<T>(n, [](T a, T b) { return T(U(a) + U(b)); });
    case Opcode::kSub:
      return BinaryThunk<T>(n, [](T a, T b) { return T(U(a) - U(b)); });
    case Opcode::kMul:
      return BinaryThunk<T>(n, [](T a, T b) { return T(U(a) * U(b)); });
    case Opcode::kDiv:
      return BinaryThunk<T>(n, [](T a, T b) { return IntDiv(a, b); });
    case Opcode::kMax:
      return BinaryThunk<T>(n, [](T a, T b) { return a > b ? a : b; });
    case Opcode::kMin:
      return BinaryThunk<T>(n, [](T a, T b) { return a < b ? a : b; });
    case Opcode::kPow:
      return BinaryThunk<T>(n, [](T a, T b) { return IntPow(a, b); });
    default:
      return UnsupportedDType(n, n.type().dtype);
  }
}

template <typename S>
std::unique_ptr<Thunk> CompareThunk(const ir::Node& n, const std::string& dir) {
  int in0 = n.operand(0), in1 = n.operand(1), out = n.id();
  int64_t count = n.type().shape.num_elements();
  int d = dir == "eq"   ? 0
          : dir == "ne" ? 1
          : dir == "lt" ? 2
          : dir == "le" ? 3
          : dir == "gt" ? 4
                        : 5;
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* a = static_cast<const S*>(ctx.buffers[in0]);
    const S* c = static_cast<const S*>(ctx.buffers[in1]);
    uint8_t* y = static_cast<uint8_t*>(ctx.buffers[out]);
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      auto run = [&](auto cmp) {
        for (int64_t i = b; i < e; ++i) y[i] = cmp(Elem<S>::Load(a[i]), Elem<S>::Load(c[i]));
      };
      switch (d) {
        case 0:
          run([](auto p, auto q) { return p == q; });
          break;
        case 1:
          run([](auto p, auto q) { return p != q; });
          break;
        case 2:
          run([](auto p, auto q) { return p < q; });
          break;
        case 3:
          run([](auto p, auto q) { return p <= q; });
          break;
        case 4:
          run([](auto p, auto q) { return p > q; });
          break;
        default:
          run([](auto p, auto q) { return p >= q; });
          break;
      }
    });
  });
}

// Element -> double -> element, with StoreFromDouble's rules (floats round to nearest even via
// f32, float -> integer truncates and saturates, NaN -> 0, nonzero -> true), in chunks.
constexpr int64_t kConvertChunk = 256;

void LoadDoubles(DType t, const void* base, int64_t start, int64_t n, double* out) {
  switch (t) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16BitsToFloat(p[i]);
      return;
    }
    case DType::kF64: {
      const double* p = static_cast<const double*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kS8: {
      const int8_t* p = static_cast<const int8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kU8: {
      const uint8_t* p = static_cast<const uint8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kS32: {
      const int32_t* p = static_cast<const int32_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kS64: {
      const int64_t* p = static_cast<const int64_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(p[i]);
      return;
    }
    case DType::kBool: {
      const uint8_t* p = static_cast<const uint8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i] ? 1.0 : 0.0;
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = LoadAsDouble(base, t, start + i);
      return;
  }
}

template <typename T>
T SaturateTrunc(double v) {
  if (v != v) return 0;
  double t = std::trunc(v);
  if (t <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (t >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(t);
}

void StoreDoubles(DType t, void* base, int64_t start, int64_t n, const double* in) {
  switch (t) {
    case DType::kF32: {
      float* p = static_cast<float*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToBf16Bits(static_cast<float>(in[i]));
      return;
    }
    case DType::kF64: {
      double* p = static_cast<double*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = in[i];
      return;
    }
    case DType::kS8: {
      int8_t* p = static_cast<int8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = SaturateTrunc<int8_t>(in[i]);
      return;
    }
    case DType::kU8: {
      uint8_t* p = static_cast<uint8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = SaturateTrunc<uint8_t>(in[i]);
      return;
    }
    case DType::kS32: {
      int32_t* p = static_cast<int32_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = SaturateTrunc<int32_t>(in[i]);
      return;
    }
    case DType::kS64: {
      int64_t* p = static_cast<int64_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = SaturateTrunc<int64_t>(in[i]);
      return;
    }
    case DType::kBool: {
      uint8_t* p = static_cast<uint8_t*>(base) + start;
      for (int64_t i = 0; i < n; ++i) p[i] = in[i] != 0.0 ? 1 : 0;
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) StoreFromDouble(base, t, start + i, in[i]);
      return;
  }
}

}  // namespace

LowerResult LowerUnaryLoop(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (lc.operand_type(n, 0).dtype != t) return UnsupportedDType(n, lc.operand_type(n, 0).dtype);
  return VisitNumeric(
      t,
      [&](auto tag) -> LowerResult {
        using S = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<S>)
          return UnaryInt<S>(n);
        else
          return UnaryFloat<S>(n);
      },
      UnsupportedDType(n, t));
}

LowerResult LowerBinaryLoop(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (lc.operand_type(n, 0) != n.type() || lc.operand_type(n, 1) != n.type())
    return Unimplemented(n, "operands must have the result's type (broadcasts are explicit)");
  if (t == DType::kBool && (n.opcode() == Opcode::kMax || n.opcode() == Opcode::kMin))
    return BinaryInt<uint8_t>(n);
  return VisitNumeric(
      t,
      [&](auto tag) -> LowerResult {
        using S = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<S>)
          return BinaryInt<S>(n);
        else
          return BinaryFloat<S>(n);
      },
      UnsupportedDType(n, t));
}

LowerResult LowerCompare(const ir::Node& n, LowerContext& lc) {
  DType t = lc.operand_type(n, 0).dtype;
  const std::string& dir = n.attr_str("direction");
  if (t == DType::kBool) return CompareThunk<uint8_t>(n, dir);
  return VisitNumeric(
      t,
      [&](auto tag) -> LowerResult { return CompareThunk<typename decltype(tag)::type>(n, dir); },
      UnsupportedDType(n, t));
}

LowerResult LowerSelect(const ir::Node& n, LowerContext& lc) {
  int pred = n.operand(0), on_true = n.operand(1), on_false = n.operand(2), out = n.id();
  int64_t count = n.type().shape.num_elements();
  auto make = [&](auto tag) -> LowerResult {
    using T = typename decltype(tag)::type;
    return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
      const uint8_t* p = static_cast<const uint8_t*>(ctx.buffers[pred]);
      const T* a = static_cast<const T*>(ctx.buffers[on_true]);
      const T* c = static_cast<const T*>(ctx.buffers[on_false]);
      T* y = static_cast<T*>(ctx.buffers[out]);
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = p[i] ? a[i] : c[i];
      });
    });
  };
  switch (DTypeSize(n.type().dtype)) {
    case 1:
      return make(TypeTag<uint8_t>{});
    case 2:
      return make(TypeTag<uint16_t>{});
    case 4:
      return make(TypeTag<uint32_t>{});
    default:
      return make(TypeTag<uint64_t>{});
  }
}

// Operands are bool or integers (nonzero is true); the result is 1/0 in the node's dtype.
LowerResult LowerLogical(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  auto make = [&](auto tag) -> LowerResult {
    using T = typename decltype(tag)::type;
    switch (n.opcode()) {
      case Opcode::kLogicalAnd:
        return BinaryThunk<T>(n, [](T a, T b) { return T(a != 0 && b != 0); });
      case Opcode::kLogicalOr:
        return BinaryThunk<T>(n, [](T a, T b) { return T(a != 0 || b != 0); });
      default:
        return UnaryThunk<T>(n, [](T a) { return T(a == 0); });
    }
  };
  if (t == DType::kBool) return make(TypeTag<uint8_t>{});
  return VisitInt(t, make, UnsupportedDType(n, t));
}

LowerResult LowerConvertLoop(const ir::Node& n, LowerContext& lc) {
  DType from = lc.operand_type(n, 0).dtype, to = n.type().dtype;
  int in = n.operand(0), out = n.id();
  int64_t count = n.type().shape.num_elements();
  if (from == to) {
    int64_t bytes = n.type().byte_size();
    return MakeFnThunk(
        n, "copy", [=](RunContext& ctx) { std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes); });
  }
  bool from_int = !IsFloating(from), to_int = !IsFloating(to);
  if (from_int && to_int) {
    // Integer/bool -> integer/bool: exact, wrapping like a C++ cast; -> bool is "nonzero".
    return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
      const void* x = ctx.buffers[in];
      void* y = ctx.buffers[out];
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) StoreFromInt64(y, to, i, LoadAsInt64(x, from, i));
      });
    });
  }
  int64_t chunks = (count + kConvertChunk - 1) / kConvertChunk;
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const void* x = ctx.buffers[in];
    void* y = ctx.buffers[out];
    ParallelFor(chunks, kElementwiseGrain / kConvertChunk, [&](int64_t b, int64_t e) {
      double buf[kConvertChunk];
      for (int64_t c = b; c < e; ++c) {
        int64_t start = c * kConvertChunk, len = std::min(kConvertChunk, count - start);
        LoadDoubles(from, x, start, len, buf);
        StoreDoubles(to, y, start, len, buf);
      }
    });
  });
}

}  // namespace kiln::runtime::cpu
