// `zerowait cat DATASET INDEX [--field F]`: one sample's listing, or one field's raw bytes.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "output.hpp"

namespace zerowait::cli {
namespace {

struct CatArgs {
  std::string path;
  uint64_t index = 0;
  std::optional<std::string> field;
};

std::vector<std::string> field_names(const SampleView& view) {
  std::vector<std::string> names;
  for (const FieldView& f : view.fields) names.emplace_back(f.name);
  return names;
}

void print_listing(const Dataset& ds, uint64_t index, const SampleView& view) {
  const SampleLocation loc = unwrap(ds.locate(index));
  print_key_values(std::cout, {{"sample", std::to_string(index)},
                               {"key", std::string(view.key)},
                               {"shard", ds.shard_path(loc.shard)},
                               {"local index", std::to_string(view.index)}});
  Table table({{"field"}, {"bytes", Align::kRight}, {"size", Align::kRight}});
  for (const FieldView& f : view.fields) {
    table.add_row(
        {std::string(f.name), std::to_string(f.bytes.size()), format_bytes(f.bytes.size())});
  }
  std::cout << '\n';
  table.print(std::cout);
}

int run_cat(const CatArgs& args) {
  std::shared_ptr<Dataset> ds = open_dataset(args.path);
  if (args.index >= ds->size()) {
    throw CliError("sample index " + std::to_string(args.index) + " is out of range: '" +
                   args.path + "' has " + std::to_string(ds->size()) + " samples" +
                   (ds->size() > 0 ? " (valid: 0.." + std::to_string(ds->size() - 1) + ")" : ""));
  }
  ReadOptions options;
  options.verify = true;  // one checksum of one sample: never print corrupt bytes unknowingly
  const Sample sample = unwrap(ds->read(args.index, options));
  if (!args.field) {
    print_listing(*ds, args.index, sample.view);
    return kExitOk;
  }
  const FieldView* field = sample.view.field(*args.field);
  if (field == nullptr) {
    throw CliError("sample " + std::to_string(args.index) + " (key '" +
                   std::string(sample.view.key) + "') has no field '" + *args.field +
                   "'; its fields are: " + join_limited(field_names(sample.view), SIZE_MAX));
  }
  // A reader that stops early (`| head -c 100`) closed the pipe on purpose: not an error.
  const int err = write_all(STDOUT_FILENO, field->bytes);
  if (err != 0 && err != EPIPE) check(errno_status(err, "cannot write", "stdout"));
  return kExitOk;
}

}  // namespace

Command add_cat_command(CLI::App& app) {
  auto args = std::make_shared<CatArgs>();
  CLI::App* cmd =
      app.add_subcommand("cat", "List one sample's fields, or write one field's bytes to stdout");
  add_dataset_argument(cmd, "DATASET", &args->path);
  cmd->add_option("INDEX", args->index, "Global sample index, from 0")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->required();
  cmd->add_option("-f,--field", args->field, "Write this field's raw bytes to stdout")
      ->type_name("FIELD");
  cmd->footer(
      "Examples:\n"
      "  zerowait cat /fast/train 17\n"
      "  zerowait cat /fast/train 17 --field jpg > sample17.jpg");
  return {cmd, [args] { return run_cat(*args); }};
}

}  // namespace zerowait::cli
