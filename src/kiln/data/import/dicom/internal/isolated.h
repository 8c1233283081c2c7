// Runs a GDCM call in a forked child process. Debian's GDCM is built with assertions on and
// aborts the whole process on many malformed or unusual files (pydicom's own test files include
// several: 1-bit liver_1frame.dcm, rtdose_1frame.dcm, a DICOMDIR without offsets, ...), which would
// kill an import or a `kiln predict` job over thousands of studies. In the child, fn's result is
// sent back over a pipe; a child that dies by a signal becomes an error naming the signal and
// GDCM's last stderr line ("Assertion `!(BitsAllocated % 8)' failed."), so the caller reports the
// file and goes on. The cost is one fork per call (about a millisecond here).
//
//   absl::StatusOr<std::string> r = internal::RunIsolated([&] { return Decode(bytes); });
//
// fn runs in a copy of the process made by fork() from a multi-threaded parent: it must only use
// what is safe there (glibc's malloc and stdio are; GDCM's decoders are), and it must not touch
// other threads' state.
#ifndef KILN_DATA_IMPORT_DICOM_INTERNAL_ISOLATED_H_
#define KILN_DATA_IMPORT_DICOM_INTERNAL_ISOLATED_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace kiln::data::internal {

absl::StatusOr<std::string> RunIsolated(const std::function<absl::StatusOr<std::string>()>& fn);

}  // namespace kiln::data::internal

#endif  // KILN_DATA_IMPORT_DICOM_INTERNAL_ISOLATED_H_
