#include "testing/doctor_fixture.hpp"

#include <gtest/gtest.h>

#include <filesystem>

namespace zerowait::testing {

namespace fs = std::filesystem;

void DoctorFixture::file(const std::string& path, const std::string& text) {
  write_file(root() + path, text);
}

void DoctorFixture::link(const std::string& path, const std::string& target) {
  fs::create_directories(fs::path(root() + path).parent_path());
  fs::create_symlink(target, root() + path);
}

void DoctorFixture::dir(const std::string& path) { fs::create_directories(root() + path); }

doctor::DoctorReport DoctorFixture::run(doctor::DoctorOptions options) {
  write_file(root() + "/zerowait-facts.json", facts_.dump(2));
  options.root = root();
  return doctor::run_doctor(options);
}

std::vector<doctor::Finding> findings_of(const doctor::DoctorReport& report,
                                         const std::string& check) {
  std::vector<doctor::Finding> found;
  for (const doctor::Finding& f : report.findings) {
    if (f.check == check) found.push_back(f);
  }
  return found;
}

doctor::Finding only_finding(const doctor::DoctorReport& report, const std::string& check) {
  const std::vector<doctor::Finding> found = findings_of(report, check);
  EXPECT_EQ(found.size(), 1u) << "findings of " << check;
  return found.size() == 1 ? found[0] : doctor::Finding{};
}

}  // namespace zerowait::testing
