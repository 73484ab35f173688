#include "testing/testing.hpp"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace zerowait::testing {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" lacks \"" << part << "\"";
}
namespace fs = std::filesystem;

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/zerowait-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    ADD_FAILURE() << "cannot write " << path;
    throw std::runtime_error("cannot write " + path);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    throw std::runtime_error("cannot read " + path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::vector<std::byte> to_bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::string to_string(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(size, '\0');
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<char>(rng());
  return out;
}

std::string make_jpeg(int width, int height, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> pixels(static_cast<size_t>(width) * height * 3);
  for (auto& p : pixels) p = static_cast<unsigned char>(rng() & 0xff);
  tjhandle handle = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  if (tjCompress2(handle, pixels.data(), width, 0, height, TJPF_RGB, &jpeg, &jpeg_size, TJSAMP_420,
                  85, 0) != 0) {
    tjDestroy(handle);
    throw std::runtime_error("tjCompress2 failed");
  }
  std::string out(reinterpret_cast<char*>(jpeg), jpeg_size);
  tjFree(jpeg);
  tjDestroy(handle);
  return out;
}

namespace {
void drain(int fd, std::string* out) {
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out->append(buf, static_cast<size_t>(n));
}
}  // namespace

CommandResult run_command(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (const auto& e : extra_env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult result;
  std::thread err_reader([&] { drain(err_pipe[0], &result.err); });
  drain(out_pipe[0], &result.out);
  err_reader.join();
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult run_cli(const std::vector<std::string>& args,
                      const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv{ZEROWAIT_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, extra_env);
}

std::vector<std::string> unprivileged(std::vector<std::string> argv) {
  if (::geteuid() != 0) return argv;
  const std::string id = std::to_string(kUnprivilegedId);
  std::vector<std::string> command = {"/usr/bin/setpriv", "--reuid=" + id,   "--regid=" + id,
                                      "--clear-groups",   "--inh-caps=-all", "--"};
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

std::string run_unprivileged(const std::function<std::string()>& body) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return "";
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(kUnprivilegedId) != 0 ||
                             ::setuid(kUnprivilegedId) != 0)) {
      _exit(2);
    }
    const std::string text = body();
    const char* at = text.data();
    for (size_t left = text.size(); left > 0;) {
      const ssize_t wrote = ::write(pipe_fds[1], at, left);
      if (wrote <= 0) _exit(3);
      at += wrote;
      left -= size_t(wrote);
    }
    _exit(0);
  }
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) {
    text.append(buffer, size_t(got));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  return text;
}

CommandResult run_cli_unprivileged(const std::vector<std::string>& args,
                                   const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv{ZEROWAIT_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(unprivileged(std::move(argv)), extra_env);
}

}  // namespace zerowait::testing
