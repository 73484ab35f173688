#include "unknown_command.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace zerowait::cli {
namespace {

// Insertions, deletions and substitutions that turn `a` into `b` (Levenshtein).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<CLI::App*> commands_of(CLI::App& app) {
  return app.get_subcommands([](CLI::App*) { return true; });
}

}  // namespace

std::optional<std::string> unknown_command_message(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  std::string where = app.get_name();
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const std::vector<CLI::App*> commands = commands_of(*current);
    if (commands.empty()) return std::nullopt;  // a command that takes arguments, not commands
    if (word.starts_with("-")) continue;        // --help, --version: CLI11 answers them
    const auto named = std::find_if(commands.begin(), commands.end(),
                                    [&](CLI::App* c) { return c->check_name(word); });
    if (named != commands.end()) {
      current = *named;
      where += " " + current->get_name();
      continue;
    }
    // Close enough to be a slip of the keyboard: at most a third of the word's letters wrong.
    const size_t close = std::max<size_t>(1, word.size() / 3);
    CLI::App* nearest = nullptr;
    size_t best = close + 1;
    std::string names;
    for (CLI::App* c : commands) {
      const size_t d = edit_distance(word, c->get_name());
      if (d < best) best = d, nearest = c;
      names += (names.empty() ? "" : ", ") + c->get_name();
    }
    std::string message = "unknown command '" + word + "'";
    if (nearest != nullptr) return message + "; did you mean '" + nearest->get_name() + "'?";
    return message + "; the commands of '" + where + "' are " + names;
  }
  return std::nullopt;
}

}  // namespace zerowait::cli
