// IR text parser: the grammar is in docs/ir.md. A hand-written lexer turns the text into tokens
// with line/column positions, then a flat (non-recursive) parser builds the graph node by node
// through InferType, so no input can exhaust the stack, and every error names where it happened.
#include "kiln/ir/parser.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ir/internal/text_format.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::ir {

namespace {

using text_internal::IsIdentChar;
using text_internal::IsIdentStart;
using text_internal::IsNameChar;

constexpr int kMaxRank = 64;
constexpr int64_t kMaxElements = int64_t{1} << 48;
constexpr int64_t kMaxSplatBytes = int64_t{1} << 30;  // a splat constant may expand to this much
constexpr size_t kMaxDescribe = 32;

enum class Tok { kEnd, kIdent, kValue, kGraphName, kInt, kFloat, kHex, kString, kPunct };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // names and strings unescaped, without sigil or quotes; hex without "0x"
  int line = 0;
  int col = 0;
};

std::string Printable(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f || c == '\'') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Describe(const Token& t) {
  std::string text = t.text.size() > kMaxDescribe ? t.text.substr(0, kMaxDescribe) + "..." : t.text;
  switch (t.kind) {
    case Tok::kEnd:
      return "end of input";
    case Tok::kString:
      return "string \"" + Printable(text) + "\"";
    case Tok::kValue:
      return "'%" + Printable(text) + "'";
    case Tok::kGraphName:
      return "'@" + Printable(text) + "'";
    case Tok::kHex:
      return "'0x" + Printable(text) + "'";
    default:
      return "'" + Printable(text) + "'";
  }
}

absl::Status ErrorAt(int line, int col, const std::string& msg) {
  return absl::InvalidArgumentError("line " + std::to_string(line) + ", col " +
                                    std::to_string(col) + ": " + msg);
}

// Dims >= 0 and at most kMaxElements elements in all (computed without overflow).
bool WithinElementLimit(const Shape& shape) {
  int64_t elements = 1;
  for (int64_t d : shape.dims()) {
    if (d < 0 || d > kMaxElements) return false;
    if (d != 0 && elements > kMaxElements / d) return false;
    elements *= d;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Lexer

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  absl::Status Run(std::vector<Token>* out) {
    while (true) {
      SkipSpaceAndComments();
      Token t;
      t.line = line_;
      t.col = col_;
      if (pos_ >= src_.size()) {
        out->push_back(std::move(t));
        return absl::OkStatus();
      }
      absl::Status s = LexOne(t);
      if (!s.ok()) return s;
      out->push_back(std::move(t));
    }
  }

 private:
  char At(size_t p) const { return p < src_.size() ? src_[p] : '\0'; }
  bool More(size_t p) const { return p < src_.size(); }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
  static bool IsHexDigit(char c) {
    return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  }

  void Advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < src_.size(); ++i, ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }

  void SkipSpaceAndComments() {
    while (More(pos_)) {
      char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v') {
        Advance();
      } else if (c == '#' || (c == '/' && At(pos_ + 1) == '/')) {
        while (More(pos_) && src_[pos_] != '\n') Advance();
      } else {
        break;
      }
    }
  }

  absl::Status Error(const std::string& msg) const { return ErrorAt(line_, col_, msg); }

  absl::Status LexString(Token& t) {
    Advance();  // opening quote
    while (true) {
      if (!More(pos_) || src_[pos_] == '\n') return ErrorAt(t.line, t.col, "unterminated string");
      char c = src_[pos_];
      if (c == '"') {
        Advance();
        return absl::OkStatus();
      }
      if (c != '\\') {
        t.text += c;
        Advance();
        continue;
      }
      char e = At(pos_ + 1);
      switch (e) {
        case 'n':
          t.text += '\n';
          break;
        case 't':
          t.text += '\t';
          break;
        case 'r':
          t.text += '\r';
          break;
        case '"':
          t.text += '"';
          break;
        case '\\':
          t.text += '\\';
          break;
        case 'x': {
          if (!IsHexDigit(At(pos_ + 2)) || !IsHexDigit(At(pos_ + 3)))
            return Error("expected two hex digits after \\x in string");
          unsigned v = 0;
          std::from_chars(src_.data() + pos_ + 2, src_.data() + pos_ + 4, v, 16);
          t.text += static_cast<char>(v);
          Advance(2);
          break;
        }
        default:
          return Error("unknown escape '\\" + Printable(std::string_view(&e, More(pos_ + 1))) +
                       "' in string (use \\n \\t \\r \\\" \\\\ \\xHH)");
      }
      Advance(2);
    }
  }

  absl::Status LexNumber(Token& t) {
    size_t p = pos_;
    if (src_[p] == '-') ++p;
    if (IsAlpha(At(p))) {  // -inf, -nan
      size_t q = p;
      while (IsIdentChar(At(q))) ++q;
      std::string_view word = src_.substr(p, q - p);
      if (word != "inf" && word != "nan")
        return Error("malformed number '" + Printable(src_.substr(pos_, q - pos_)) + "'");
      t.kind = Tok::kFloat;
      t.text = std::string(src_.substr(pos_, q - pos_));
      Advance(q - pos_);
      return absl::OkStatus();
    }
    if (src_[pos_] == '0' && (At(p + 1) == 'x' || At(p + 1) == 'X')) {
      size_t q = p + 2;
      while (IsHexDigit(At(q))) ++q;
      if (IsIdentChar(At(q))) return Error("malformed hex literal");
      t.kind = Tok::kHex;
      t.text = std::string(src_.substr(p + 2, q - p - 2));
      Advance(q - pos_);
      return absl::OkStatus();
    }
    bool is_float = false;
    while (IsDigit(At(p))) ++p;
    if (At(p) == '.') {
      is_float = true;
      ++p;
      while (IsDigit(At(p))) ++p;
    }
    if (At(p) == 'e' || At(p) == 'E') {
      is_float = true;
      ++p;
      if (At(p) == '+' || At(p) == '-') ++p;
      if (!IsDigit(At(p))) return Error("malformed number: expected digits in the exponent");
      while (IsDigit(At(p))) ++p;
    }
    if (IsIdentChar(At(p)) || At(p) == '-') {
      size_t q = p;
      while (IsIdentChar(At(q)) || At(q) == '-') ++q;
      return Error("malformed number '" + Printable(src_.substr(pos_, q - pos_)) + "'");
    }
    t.kind = is_float ? Tok::kFloat : Tok::kInt;
    t.text = std::string(src_.substr(pos_, p - pos_));
    Advance(p - pos_);
    return absl::OkStatus();
  }

  absl::Status LexOne(Token& t) {
    char c = src_[pos_];
    if (c == '%' || c == '@') {
      t.kind = c == '%' ? Tok::kValue : Tok::kGraphName;
      Advance();
      if (At(pos_) == '"') return LexString(t);
      size_t q = pos_;
      while (IsNameChar(At(q))) ++q;
      if (q == pos_)
        return ErrorAt(t.line, t.col, std::string("expected a name after '") + c + "'");
      t.text = std::string(src_.substr(pos_, q - pos_));
      Advance(q - pos_);
      return absl::OkStatus();
    }
    if (c == '"') {
      t.kind = Tok::kString;
      return LexString(t);
    }
    if (IsIdentStart(c)) {
      size_t q = pos_;
      while (IsIdentChar(At(q))) ++q;
      t.text = std::string(src_.substr(pos_, q - pos_));
      if (t.text == "nan" && At(q) == '(') {  // nan(0x<bits>)
        size_t r = q;
        while (r < q + 24 && More(r) && src_[r] != ')') ++r;
        if (At(r) != ')') return Error("malformed nan payload: expected nan(0x<16 hex digits>)");
        t.text = std::string(src_.substr(pos_, r + 1 - pos_));
        q = r + 1;
      }
      bool is_float = t.text == "inf" || t.text == "nan" || t.text.rfind("nan(", 0) == 0;
      t.kind = is_float ? Tok::kFloat : Tok::kIdent;
      Advance(q - pos_);
      return absl::OkStatus();
    }
    if (IsDigit(c) || (c == '-' && (IsDigit(At(pos_ + 1)) || IsAlpha(At(pos_ + 1))))) {
      return LexNumber(t);
    }
    if (std::strchr("(){}[],=:", c) != nullptr && c != '\0') {
      t.kind = Tok::kPunct;
      t.text = std::string(1, c);
      Advance();
      return absl::OkStatus();
    }
    return Error("unexpected character '" + Printable(std::string_view(&c, 1)) + "'");
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
};

// ---------------------------------------------------------------------------------------------
// Parser

// An attribute value as written, before it is checked against what the attribute needs.
struct RawValue {
  enum Kind { kInt, kFloat, kString, kHex, kBool, kList } kind = kInt;
  const Token* tok = nullptr;
  int64_t i = 0;
  double d = 0;
  std::vector<RawValue> elems;  // kList: scalars only
};

struct Defined {
  int id;
  const Token* tok;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  absl::StatusOr<Graph> Parse();

 private:
  const Token& Peek() const { return toks_[pos_]; }
  const Token& Next() {
    const Token& t = toks_[pos_];
    if (t.kind != Tok::kEnd) ++pos_;
    return t;
  }
  static bool IsPunct(const Token& t, char c) {
    return t.kind == Tok::kPunct && t.text.size() == 1 && t.text[0] == c;
  }
  static absl::Status Error(const Token& t, const std::string& msg) {
    return ErrorAt(t.line, t.col, msg);
  }
  static absl::Status Expected(const Token& t, const std::string& what) {
    return Error(t, "expected " + what + ", got " + Describe(t));
  }
  absl::Status ExpectPunct(char c) {
    const Token& t = Next();
    if (!IsPunct(t, c)) return Expected(t, std::string("'") + c + "'");
    return absl::OkStatus();
  }

  absl::Status ParseScalar(const Token& t, RawValue* v);
  absl::Status ParseValue(RawValue* v);
  absl::Status ParseType(Type* type);
  absl::Status ParseStatement(Graph& g);
  absl::Status ParseAttributes(Opcode op, AttrMap* attrs, std::optional<RawValue>* literal_value);
  absl::Status ParseReturn(Graph& g);
  absl::Status ParseFusionGroup(Graph& g);
  void InferLegacyFusionGroups(Graph& g) const;
  absl::Status CheckParameters(const Graph& g);

  absl::StatusOr<AttrValue> ToAttr(const std::string& name, const RawValue& v);
  absl::StatusOr<std::shared_ptr<const Tensor>> ToLiteral(const RawValue& v, const Type& type);

  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::map<std::string, Defined> values_;   // %name -> node
  std::vector<const Token*> node_tok_;      // node id -> where its statement starts
  std::vector<const Token*> op_tok_;        // node id -> its op name
  std::map<std::string, int> param_names_;  // parameter name -> node
  bool declared_groups_ = false;            // the text has 'fusion <id> kind=<kind>' lines
};

absl::Status Parser::ParseScalar(const Token& t, RawValue* v) {
  v->tok = &t;
  if (t.kind == Tok::kInt) {
    v->kind = RawValue::kInt;
    auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v->i);
    if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
      return Error(t, "integer " + Printable(t.text) + " is out of the int64 range");
    return absl::OkStatus();
  }
  if (t.kind == Tok::kFloat) {
    v->kind = RawValue::kFloat;
    if (!text_internal::ParseFloatText(t.text, &v->d))
      return Error(t, "malformed or out-of-range float '" + Printable(t.text) + "'");
    return absl::OkStatus();
  }
  if (t.kind == Tok::kIdent && (t.text == "true" || t.text == "false")) {
    v->kind = RawValue::kBool;
    v->i = t.text == "true";
    return absl::OkStatus();
  }
  return Expected(t, "a number");
}

absl::Status Parser::ParseValue(RawValue* v) {
  const Token& t = Next();
  v->tok = &t;
  if (t.kind == Tok::kString) {
    v->kind = RawValue::kString;
    return absl::OkStatus();
  }
  if (t.kind == Tok::kHex) {
    v->kind = RawValue::kHex;
    return absl::OkStatus();
  }
  if (IsPunct(t, '[')) {
    v->kind = RawValue::kList;
    if (IsPunct(Peek(), ']')) {
      Next();
      return absl::OkStatus();
    }
    while (true) {
      RawValue e;
      absl::Status s = ParseScalar(Next(), &e);
      if (!s.ok()) return s;
      v->elems.push_back(std::move(e));
      const Token& sep = Next();
      if (IsPunct(sep, ']')) return absl::OkStatus();
      if (!IsPunct(sep, ',')) return Expected(sep, "',' or ']'");
    }
  }
  if (t.kind == Tok::kInt || t.kind == Tok::kFloat ||
      (t.kind == Tok::kIdent && (t.text == "true" || t.text == "false")))
    return ParseScalar(t, v);
  return Expected(t, "an attribute value (number, string, [list] or 0x hex)");
}

absl::StatusOr<AttrValue> Parser::ToAttr(const std::string& name, const RawValue& v) {
  switch (v.kind) {
    case RawValue::kInt:
      return AttrValue(v.i);
    case RawValue::kFloat:
      return AttrValue(v.d);
    case RawValue::kString:
      return AttrValue(v.tok->text);
    case RawValue::kList: {
      std::vector<int64_t> list;
      for (const RawValue& e : v.elems) {
        if (e.kind != RawValue::kInt)
          return Error(*e.tok, "attribute '" + Printable(name) +
                                   "': list elements must be integers, got " + Describe(*e.tok));
        list.push_back(e.i);
      }
      return AttrValue(std::move(list));
    }
    default:
      return Error(*v.tok, "attribute '" + Printable(name) +
                               "': expected an integer, float, string or integer list, got " +
                               Describe(*v.tok));
  }
}

absl::StatusOr<std::shared_ptr<const Tensor>> Parser::ToLiteral(const RawValue& v,
                                                                const Type& type) {
  const int64_t n = type.shape.num_elements();
  const int64_t size = DTypeSize(type.dtype);
  const int64_t bytes = n * size;  // no overflow: n <= 2^48
  if (v.kind == RawValue::kHex) {
    const std::string& hex = v.tok->text;
    if (hex.size() % 2 != 0) return Error(*v.tok, "hex literal has an odd number of digits");
    if (static_cast<int64_t>(hex.size() / 2) != bytes)
      return Error(*v.tok, "hex literal has " + std::to_string(hex.size() / 2) + " bytes, type " +
                               type.ToString() + " needs " + std::to_string(bytes));
    auto t = std::make_shared<Tensor>(type.dtype, type.shape);
    auto* out = static_cast<uint8_t*>(t->raw_data());
    for (int64_t i = 0; i < bytes; ++i) {
      unsigned b = 0;
      std::from_chars(hex.data() + 2 * i, hex.data() + 2 * i + 2, b, 16);
      out[i] = static_cast<uint8_t>(b);
    }
    return std::shared_ptr<const Tensor>(std::move(t));
  }
  if (v.kind == RawValue::kString)
    return Error(*v.tok, "constant value must be a number, a list of numbers or 0x hex");
  auto encode = [&](const RawValue& e, void* base, int64_t i) -> absl::Status {
    std::string err;
    if (type.dtype == DType::kBool) {
      if (e.kind != RawValue::kBool)
        return Error(*e.tok, "expected true or false for bool, got " + Describe(*e.tok));
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(e.i);
      return absl::OkStatus();
    }
    if (e.kind == RawValue::kBool)
      return Error(*e.tok, "expected a number for " + std::string(DTypeName(type.dtype)) +
                               ", got " + Describe(*e.tok));
    err = text_internal::EncodeElement(type.dtype, e.kind == RawValue::kInt, e.i, e.d, base, i);
    if (!err.empty()) return Error(*e.tok, err + ", got " + Describe(*e.tok));
    return absl::OkStatus();
  };
  if (v.kind == RawValue::kList) {
    if (static_cast<int64_t>(v.elems.size()) != n)
      return Error(*v.tok, "constant of type " + type.ToString() + " needs " + std::to_string(n) +
                               " values, got " + std::to_string(v.elems.size()));
    auto t = std::make_shared<Tensor>(type.dtype, type.shape);
    for (int64_t i = 0; i < n; ++i) {
      absl::Status s = encode(v.elems[i], t->raw_data(), i);
      if (!s.ok()) return s;
    }
    return std::shared_ptr<const Tensor>(std::move(t));
  }
  // A single number: every element takes it.
  if (bytes > kMaxSplatBytes)
    return Error(*v.tok, "splat constant of type " + type.ToString() + " is too large (" +
                             std::to_string(bytes) + " bytes)");
  uint8_t elem[8] = {0};
  absl::Status s = encode(v, elem, 0);
  if (!s.ok()) return s;
  auto t = std::make_shared<Tensor>(type.dtype, type.shape);
  auto* out = static_cast<uint8_t*>(t->raw_data());
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * size, elem, static_cast<size_t>(size));
  return std::shared_ptr<const Tensor>(std::move(t));
}

absl::Status Parser::ParseType(Type* type) {
  const Token& dt = Next();
  if (dt.kind != Tok::kIdent) return Expected(dt, "a type such as f32[2,3]");
  std::optional<DType> d = DTypeFromName(dt.text);
  if (!d) return Error(dt, "unknown dtype '" + Printable(dt.text) + "'");
  type->dtype = *d;
  const Token& open = Next();
  if (!IsPunct(open, '[')) return Expected(open, "'[' after the dtype (a scalar is f32[])");
  std::vector<int64_t> dims;
  int64_t elements = 1;
  if (IsPunct(Peek(), ']')) {
    Next();
  } else {
    while (true) {
      const Token& t = Next();
      if (t.kind != Tok::kInt) return Expected(t, "a dimension size");
      int64_t v = 0;
      auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size() || v < 0 ||
          v > kMaxElements)
        return Error(t, "dimension size " + Printable(t.text) + " is out of range [0, 2^48]");
      if (static_cast<int>(dims.size()) == kMaxRank)
        return Error(t, "rank exceeds the limit of " + std::to_string(kMaxRank));
      dims.push_back(v);
      if (v != 0 && elements > kMaxElements / v)
        elements = kMaxElements + 1;
      else
        elements *= v;
      const Token& sep = Next();
      if (IsPunct(sep, ']')) break;
      if (!IsPunct(sep, ',')) return Expected(sep, "',' or ']'");
    }
  }
  if (elements > kMaxElements) return Error(dt, "type has more than 2^48 elements");
  type->shape = Shape(std::move(dims));
  return absl::OkStatus();
}

// '{' attribute (',' attribute)* '}', when present; a constant's `value` goes to `literal_value`.
absl::Status Parser::ParseAttributes(Opcode op, AttrMap* attrs,
                                     std::optional<RawValue>* literal_value) {
  if (IsPunct(Peek(), '{')) {
    Next();
    if (IsPunct(Peek(), '}')) {
      Next();
    } else {
      std::set<std::string> seen;
      while (true) {
        const Token& key = Next();
        if (key.kind != Tok::kIdent && key.kind != Tok::kString)
          return Expected(key, "an attribute name");
        if (!seen.insert(key.text).second)
          return Error(key, "duplicate attribute '" + Printable(key.text) + "'");
        absl::Status s = ExpectPunct('=');
        if (!s.ok()) return s;
        RawValue v;
        s = ParseValue(&v);
        if (!s.ok()) return s;
        if (op == Opcode::kConstant && key.text == "value") {
          *literal_value = std::move(v);
        } else {
          absl::StatusOr<AttrValue> a = ToAttr(key.text, v);
          if (!a.ok()) return a.status();
          attrs->emplace(key.text, *std::move(a));
        }
        const Token& sep = Next();
        if (IsPunct(sep, '}')) break;
        if (!IsPunct(sep, ',')) return Expected(sep, "',' or '}'");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Parser::ParseStatement(Graph& g) {
  const Token& name = Next();  // kValue, checked by the caller
  auto prev = values_.find(name.text);
  if (prev != values_.end())
    return Error(name, "value %" + Printable(name.text) + " is already defined (at line " +
                           std::to_string(prev->second.tok->line) + ", col " +
                           std::to_string(prev->second.tok->col) + ")");
  absl::Status s = ExpectPunct('=');
  if (!s.ok()) return s;
  const Token& op_tok = Next();
  if (op_tok.kind != Tok::kIdent) return Expected(op_tok, "an op name");
  std::optional<Opcode> op = OpcodeFromName(op_tok.text);
  if (!op) return Error(op_tok, "unknown op '" + Printable(op_tok.text) + "'");
  const std::string op_name(OpcodeName(*op));
  s = ExpectPunct('(');
  if (!s.ok()) return s;

  std::vector<int> operands;
  std::vector<Type> operand_types;
  if (IsPunct(Peek(), ')')) {
    Next();
  } else {
    while (true) {
      const Token& t = Next();
      if (t.kind != Tok::kValue) return Expected(t, "an operand (%name)");
      auto it = values_.find(t.text);
      if (it == values_.end()) return Error(t, "use of undefined value %" + Printable(t.text));
      operands.push_back(it->second.id);
      operand_types.push_back(g.node(it->second.id).type());
      const Token& sep = Next();
      if (IsPunct(sep, ')')) break;
      if (!IsPunct(sep, ',')) return Expected(sep, "',' or ')'");
    }
  }

  AttrMap attrs;
  std::optional<RawValue> literal_value;
  s = ParseAttributes(*op, &attrs, &literal_value);
  if (!s.ok()) return s;

  std::optional<Type> declared;
  if (IsPunct(Peek(), ':')) {
    Next();
    Type t;
    s = ParseType(&t);
    if (!s.ok()) return s;
    declared = std::move(t);
  }

  // Semantic checks, reported at the op name.
  const int arity = OpcodeArity(*op);
  const int count = static_cast<int>(operands.size());
  if (arity >= 0 && count != arity)
    return Error(op_tok, op_name + " takes " + std::to_string(arity) + " operand" +
                             (arity == 1 ? "" : "s") + ", got " + std::to_string(count));
  if (arity < 0 && count == 0) return Error(op_tok, op_name + " takes at least 1 operand, got 0");
  if (!declared && (OpcodeKind(*op) == OpKind::kSource || *op == Opcode::kConvert))
    return Error(op_tok, op_name +
                             " needs a ': type' annotation (its type is declared, not "
                             "inferred)");
  std::shared_ptr<const Tensor> literal;
  if (*op == Opcode::kConstant) {
    if (!literal_value) return Error(op_tok, "constant needs a value attribute");
    absl::StatusOr<std::shared_ptr<const Tensor>> l = ToLiteral(*literal_value, *declared);
    if (!l.ok()) return l.status();
    literal = *std::move(l);
  }
  if (*op == Opcode::kParameter) {
    auto idx = attrs.find("index");
    auto pname = attrs.find("name");
    if (idx == attrs.end() || !std::holds_alternative<int64_t>(idx->second))
      return Error(op_tok, "parameter needs an integer attribute 'index'");
    if (pname == attrs.end() || !std::holds_alternative<std::string>(pname->second) ||
        std::get<std::string>(pname->second).empty())
      return Error(op_tok, "parameter needs a non-empty string attribute 'name'");
    const std::string& pn = std::get<std::string>(pname->second);
    auto it = param_names_.find(pn);
    if (it != param_names_.end())
      return Error(op_tok, "parameter name \"" + Printable(pn) + "\" is already used by %" +
                               std::to_string(it->second));
    param_names_.emplace(pn, g.num_nodes());
  }
  absl::StatusOr<Type> type = InferType(*op, operand_types, attrs, declared);
  if (!type.ok())
    return Error(op_tok,
                 std::string(type.status().message().data(), type.status().message().size()));
  if (!WithinElementLimit(type->shape))
    return Error(op_tok, op_name + ": result type " + type->ToString() +
                             " has a negative size or more than 2^48 elements");
  if (declared && *declared != *type)
    return Error(op_tok, op_name + ": declared type " + declared->ToString() +
                             " does not match the inferred type " + type->ToString());

  int id =
      g.AddNode(*op, std::move(operands), *std::move(type), std::move(attrs), std::move(literal));
  values_.emplace(name.text, Defined{id, &name});
  node_tok_.push_back(&name);
  op_tok_.push_back(&op_tok);
  return absl::OkStatus();
}

absl::Status Parser::ParseReturn(Graph& g) {
  const Token& ret = Next();  // 'return', checked by the caller
  std::set<std::string> names;
  if (!IsPunct(Peek(), '}')) {
    while (true) {
      const Token& name = Next();
      if (name.kind != Tok::kIdent && name.kind != Tok::kString)
        return Expected(name, "an output name");
      if (name.text.empty()) return Error(name, "output name must not be empty");
      if (!names.insert(name.text).second)
        return Error(name, "duplicate output name '" + Printable(name.text) + "'");
      absl::Status s = ExpectPunct('=');
      if (!s.ok()) return s;
      const Token& v = Next();
      if (v.kind != Tok::kValue) return Expected(v, "an output value (%name)");
      auto it = values_.find(v.text);
      if (it == values_.end()) return Error(v, "use of undefined value %" + Printable(v.text));
      g.AddOutput(name.text, it->second.id);
      if (Peek().kind == Tok::kIdent && Peek().text == "in_place_of") {
        Next();
        const Token& p = Next();
        if (p.kind != Tok::kValue) return Expected(p, "a parameter (%name) after in_place_of");
        auto param = values_.find(p.text);
        if (param == values_.end()) return Error(p, "use of undefined value %" + Printable(p.text));
        const Node& pn = g.node(param->second.id);
        if (pn.opcode() != Opcode::kParameter)
          return Error(p, "in_place_of %" + Printable(p.text) + ": not a parameter");
        g.SetOutputInPlaceOf(g.outputs().size() - 1, pn.attr_int("index"));
      }
      if (!IsPunct(Peek(), ',')) break;
      Next();
    }
  }
  if (g.outputs().empty()) return Error(ret, "graph has no outputs: expected 'name=%value'");
  return absl::OkStatus();
}

// fusion <id> kind=<kind>: one entry of the graph's fusion group table.
absl::Status Parser::ParseFusionGroup(Graph& g) {
  Next();  // 'fusion', checked by the caller
  const Token& id = Next();
  if (id.kind != Tok::kInt) return Expected(id, "a fusion group id (a non-negative integer)");
  RawValue v;
  absl::Status s = ParseScalar(id, &v);
  if (!s.ok()) return s;
  if (v.i < 0) return Error(id, "fusion group id must not be negative");
  if (g.FindFusionGroup(v.i) != nullptr)
    return Error(id, "fusion group " + std::to_string(v.i) + " is already declared");
  const Token& key = Next();
  if (key.kind != Tok::kIdent || key.text != "kind") return Expected(key, "'kind'");
  s = ExpectPunct('=');
  if (!s.ok()) return s;
  const Token& kind = Next();
  FusionKind k;
  if (kind.kind != Tok::kIdent || !ParseFusionKind(kind.text, &k))
    return Expected(kind, "a fusion kind (loop, reduction, matmul_epilogue, conv_epilogue)");
  g.AddFusionGroup({v.i, k});
  declared_groups_ = true;
  return absl::OkStatus();
}

// Text written before group declarations existed carries only `fusion=<n>` attributes: each group
// gets the kind its members imply.
void Parser::InferLegacyFusionGroups(Graph& g) const {
  if (declared_groups_) return;
  for (const auto& [id, members] : g.FusionMembersByGroup())
    if (id >= 0) g.AddFusionGroup({id, InferFusionKind(g, members)});
}

absl::Status Parser::CheckParameters(const Graph& g) {
  std::vector<int> params;
  for (const Node& n : g.nodes())
    if (n.opcode() == Opcode::kParameter) params.push_back(n.id());
  std::map<int64_t, int> by_index;
  for (int id : params) {
    int64_t index = std::get<int64_t>(g.node(id).attrs().at("index"));
    if (index < 0 || index >= static_cast<int64_t>(params.size()))
      return Error(*op_tok_[id], "parameter index " + std::to_string(index) +
                                     " is out of range: the graph has " +
                                     std::to_string(params.size()) + " parameters");
    auto [it, inserted] = by_index.emplace(index, id);
    if (!inserted)
      return Error(*op_tok_[id], "parameter index " + std::to_string(index) +
                                     " is already used by %" + std::to_string(it->second));
  }
  return absl::OkStatus();
}

absl::StatusOr<Graph> Parser::Parse() {
  const Token& kw = Next();
  if (kw.kind != Tok::kIdent || kw.text != "graph") return Expected(kw, "'graph'");
  const Token& name = Next();
  if (name.kind != Tok::kGraphName) return Expected(name, "a graph name (@name)");
  Graph g(name.text);
  absl::Status s = ExpectPunct('{');
  if (!s.ok()) return s;
  while (true) {
    const Token& t = Peek();
    if (t.kind == Tok::kValue) {
      s = ParseStatement(g);
      if (!s.ok()) return s;
    } else if (t.kind == Tok::kIdent && t.text == "fusion" && g.num_nodes() == 0) {
      s = ParseFusionGroup(g);
      if (!s.ok()) return s;
    } else if (t.kind == Tok::kIdent && t.text == "return") {
      s = ParseReturn(g);
      if (!s.ok()) return s;
      break;
    } else if (IsPunct(t, '}')) {
      return Error(t, "expected 'return' before '}'");
    } else {
      return Expected(t, g.num_nodes() == 0
                             ? "a fusion group (fusion <id> kind=<kind>), a statement or 'return'"
                             : "a statement (%name = op(...)) or 'return'");
    }
  }
  s = ExpectPunct('}');
  if (!s.ok()) return s;
  const Token& end = Next();
  if (end.kind != Tok::kEnd) return Expected(end, "end of input after the graph");
  s = CheckParameters(g);
  if (!s.ok()) return s;
  InferLegacyFusionGroups(g);

  // Everything Verify checks should have been caught above with a position; this is a backstop.
  s = Verify(g);
  if (!s.ok()) {
    std::string msg(s.message().data(), s.message().size());
    const Token* where = &kw;
    int id = -1;
    if (msg.rfind("node %", 0) == 0) {
      std::from_chars(msg.data() + 6, msg.data() + msg.size(), id);
      if (id >= 0 && id < static_cast<int>(node_tok_.size())) where = node_tok_[id];
    }
    return Error(*where, msg);
  }
  return g;
}

}  // namespace

absl::StatusOr<Graph> ParseGraph(std::string_view text) {
  std::vector<Token> toks;
  absl::Status s = Lexer(text).Run(&toks);
  if (!s.ok()) return s;
  return Parser(std::move(toks)).Parse();
}

}  // namespace kiln::ir
