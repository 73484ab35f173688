// A fixture machine for the doctor's checks: a temporary root holding the /proc and /sys files a
// test plants, and the facts file for what no file holds (docs/doctor.md, "Fixtures").
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/diagnose/doctor.hpp"

namespace zerowait::testing {

class DoctorFixture {
 public:
  const std::string& root() const { return dir_.path(); }
  // Writes `text` at `path` ("/proc/meminfo") inside the root, creating parent directories.
  void file(const std::string& path, const std::string& text);
  // A symbolic link at `path` inside the root pointing to `target` (stored as given).
  void link(const std::string& path, const std::string& target);
  // A directory at `path` inside the root.
  void dir(const std::string& path);
  // The facts file's object; written by run().
  nlohmann::json& facts() { return facts_; }

  // Runs every check against the fixture.
  doctor::DoctorReport run(doctor::DoctorOptions options = {});

 private:
  TempDir dir_;
  nlohmann::json facts_ = nlohmann::json::object();
};

// The findings of `report` whose check id is `check` ("storage.nfs_version").
std::vector<doctor::Finding> findings_of(const doctor::DoctorReport& report,
                                         const std::string& check);
// The one finding of `check` (a test failure, and an empty finding, when there is not exactly
// one).
doctor::Finding only_finding(const doctor::DoctorReport& report, const std::string& check);

}  // namespace zerowait::testing
