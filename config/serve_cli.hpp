#pragma once
// The command line and TOML file of `ferry serve`, both filling one ServeConfig. Every option belongs to
// a section of the configuration; a TOML file may write an option at the top level or under its
// section ([server] port = 9527), and the command line wins over the file.
#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

#include "config/memory_options.hpp"
#include "config/serve_config.hpp"

namespace ferry::config {

class ServeCli {
 public:
  // Registers every option of `ferry serve` on `cmd`; the values land in config().
  explicit ServeCli(CLI::App& cmd);
  ServeCli(const ServeCli&) = delete;
  ServeCli& operator=(const ServeCli&) = delete;

  // After the command line is parsed: applies --config, parses the options given as text (sizes,
  // lists) and validates. Empty when the configuration is usable; else one line per problem.
  std::vector<std::string> finish();
  const ServeConfig& config() const { return config_; }

 private:
  // Adds `--name` to `section` (the TOML table and the --help group).
  template <class T>
  CLI::Option* add(const char* section, const std::string& name, T& value, const std::string& help);
  std::vector<std::string> apply_config_file(const std::string& path);

  CLI::App& cmd_;
  ServeConfig config_;
  std::string config_file_;
  std::string max_body_, split_ = "none", devices_, inject_fault_;
  MemoryOptionsText memory_;
  std::map<std::string, std::string> sections_;  // option name (no "--") -> its section
};

}  // namespace ferry::config
