// `kiln data import images|csv|text|dicom ...`, `kiln data generate clicks ...` and
// `kiln data inspect DIR` (docs/data.md):
// converters from user data to record shards plus dataset.json (src/kiln/data/), with a progress
// bar.
//
// app.cc registers them like the other commands:
//
//   DataCommands data_cmds(app);
//   app.parse(argc, argv);
//   if (int rc = data_cmds.Run(out, err); rc >= 0) return rc;   // -1: not chosen
#ifndef KILN_CLI_DATA_CMD_H_
#define KILN_CLI_DATA_CMD_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kiln/data/import/click_log.h"
#include "kiln/data/import/csv_import.h"
#ifdef KILN_HAVE_GDCM
#include "kiln/data/import/dicom/dicom_import.h"
#endif
#include "kiln/data/import/image_import.h"
#include "kiln/data/import/text_import.h"

namespace kiln::cli {

class DataCommands {
 public:
  explicit DataCommands(CLI::App& app);

  // The exit code (0, or 1 with "kiln data ...: <message>" on err), or -1 if not chosen. The
  // progress bar goes to err (redrawn in place when err is a terminal, else a line every 5 s).
  int Run(std::ostream& out, std::ostream& err);

 private:
  CLI::App* data_ = nullptr;
  CLI::App* images_ = nullptr;
  CLI::App* csv_ = nullptr;
  CLI::App* text_ = nullptr;
  CLI::App* dicom_ = nullptr;  // null in a kiln built without GDCM
  CLI::App* inspect_ = nullptr;
  CLI::App* clicks_ = nullptr;  // kiln data generate clicks
  data::ClickLogOptions click_opts_;
  void AddGenerate();
  data::ImageImportOptions image_opts_;
  std::string size_;
  data::CsvImportOptions csv_opts_;
  data::TextImportOptions text_opts_;
#ifdef KILN_HAVE_GDCM
  data::DicomImportOptions dicom_opts_;
  std::string dicom_size_, window_;
#endif
  void AddDicom(CLI::App* import);
  int RunDicom(std::ostream& out, std::ostream& err, const data::ProgressFn& progress, bool tty);
  std::string inspect_dir_;
  bool inspect_no_verify_ = false;
  bool quiet_ = false;
};

}  // namespace kiln::cli

#endif  // KILN_CLI_DATA_CMD_H_
