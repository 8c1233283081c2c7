// Lexical helpers the IR printer and parser share, so both agree on what a bare name is and how
// a constant element is written. Private to ir/; defined in printer.cc.
#ifndef KILN_IR_INTERNAL_TEXT_FORMAT_H_
#define KILN_IR_INTERNAL_TEXT_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/tensor/dtype.h"

namespace kiln::ir::text_internal {

bool IsNameChar(char c);
bool IsIdentStart(char c);
bool IsIdentChar(char c);
bool IsBareIdent(std::string_view s);
// Writes element i of `base` (dtype t) from an integer (`is_int`, v) or a float (d); returns an
// error message or "" on success.
std::string EncodeElement(DType t, bool is_int, int64_t v, double d, void* base, int64_t i);
// Parses a float literal as the printer writes it (incl. inf, nan, nan(0x...)).
bool ParseFloatText(std::string_view s, double* out);

}  // namespace kiln::ir::text_internal

#endif  // KILN_IR_INTERNAL_TEXT_FORMAT_H_
