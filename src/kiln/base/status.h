// Status helpers shared by every layer.
//
// Fallible functions return absl::Status / absl::StatusOr<T>. These macros propagate errors:
//
//   KILN_RETURN_IF_ERROR(WriteHeader(file));
//   KILN_ASSIGN_OR_RETURN(Tensor t, ReadTensor(path));
#ifndef KILN_BASE_STATUS_H_
#define KILN_BASE_STATUS_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define KILN_CONCAT_IMPL_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_IMPL_(a, b)

#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)

namespace kiln {

// Returns `s` with `context` prepended to its message ("context: message"), same code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  std::string msg(context);
  msg += ": ";
  msg.append(s.message().data(), s.message().size());
  return absl::Status(s.code(), msg);
}

}  // namespace kiln

// Aborts with file:line and the status message when `expr` is not OK. For programmer errors and
// tests only; never on user input.
#define KILN_CHECK_OK(expr)                                                          \
  do {                                                                               \
    ::absl::Status kiln_s_ = (expr);                                                 \
    if (!kiln_s_.ok()) ::kiln::internal::CheckOkFailed(__FILE__, __LINE__, kiln_s_); \
  } while (0)

#define KILN_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) ::kiln::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

namespace kiln::internal {
[[noreturn]] void CheckOkFailed(const char* file, int line, const absl::Status& s);
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond);
}  // namespace kiln::internal

#endif  // KILN_BASE_STATUS_H_
