#include "storage/s3/aws_config.hpp"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <tuple>
#include <utility>

#include "common/file.hpp"

namespace zerowait::internal {
namespace {

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const size_t last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

// The profile a section header names, or nullopt for sections that are not profiles.
std::optional<std::string> section_profile(std::string_view header, bool config_file_style) {
  const std::string_view name = trim(header);
  if (!config_file_style) return std::string(name);
  if (name == "default") return std::string("default");
  if (name.starts_with("profile ")) return std::string(trim(name.substr(8)));
  return std::nullopt;  // [sso-session ...], [services ...]
}

std::optional<std::string> non_empty(const std::optional<std::string>& value) {
  if (value && !value->empty()) return value;
  return std::nullopt;
}

std::string home_file(const EnvironmentLookup& env, const char* variable, const char* under_home) {
  if (auto path = non_empty(env(variable))) return *path;
  const std::string home = non_empty(env("HOME")).value_or("");
  return home + "/.aws/" + under_home;
}

bool is_aws_endpoint(const std::string& endpoint) {
  const size_t host_start = endpoint.find("://");
  std::string_view host = std::string_view(endpoint).substr(host_start + 3);
  host = host.substr(0, host.find_first_of(":/"));
  return host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn");
}

Result<S3Addressing> parse_addressing(const std::string& value, const std::string& where) {
  if (value == "path") return S3Addressing::kPath;
  if (value == "virtual") return S3Addressing::kVirtualHost;
  return invalid_argument(where + " is '" + value + "': expected 'path' or 'virtual'");
}

}  // namespace

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

Result<std::optional<std::map<std::string, std::string>>> read_aws_profile(
    const std::string& path, const std::string& profile, bool config_file_style) {
  ZW_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  std::optional<std::map<std::string, std::string>> found;
  bool in_profile = false;
  std::string parent;  // the key whose nested settings follow ("s3"), while indented lines do
  size_t line_number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view raw = std::string_view(text).substr(start, end - start);
    start = end + 1;
    ++line_number;
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    auto bad = [&](const std::string& why) {
      return corrupt("'" + path + "' line " + std::to_string(line_number) + ": " + why);
    };
    if (line.front() == '[') {
      if (line.back() != ']') return bad("a section header must end with ']'");
      const auto name = section_profile(line.substr(1, line.size() - 2), config_file_style);
      in_profile = name && *name == profile;
      if (in_profile && !found) found.emplace();
      parent.clear();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) return bad("expected 'name = value' or '[section]'");
    const std::string key(trim(line.substr(0, eq)));
    const std::string value(trim(line.substr(eq + 1)));
    if (key.empty()) return bad("a setting has no name");
    const bool indented = raw.front() == ' ' || raw.front() == '\t';
    if (!in_profile) continue;
    if (indented && !parent.empty()) {
      (*found)[parent + "." + key] = value;
      continue;
    }
    parent = value.empty() ? key : "";
    if (!value.empty()) (*found)[key] = value;
  }
  return found;
}

Result<S3Config> resolve_s3_config(const EnvironmentLookup& env) {
  S3Config config;
  const auto chosen_profile = non_empty(env("AWS_PROFILE"));
  config.profile = chosen_profile.value_or("default");
  const std::string credentials_file = home_file(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::string config_file = home_file(env, "AWS_CONFIG_FILE", "config");

  // Each file's settings for the profile; a missing file is no error, a broken one is.
  std::map<std::string, std::string> from_credentials, from_config;
  bool profile_seen = false;
  for (auto [path, settings, config_style] :
       {std::tuple{credentials_file, &from_credentials, false},
        std::tuple{config_file, &from_config, true}}) {
    auto read = read_aws_profile(path, config.profile, config_style);
    if (!read.is_ok()) {
      if (read.status().code() == ErrorCode::kNotFound) continue;
      return read.status();
    }
    if (read.value()) {
      *settings = std::move(*read.value());
      profile_seen = true;
    }
  }
  if (chosen_profile && !profile_seen) {
    return not_found("AWS_PROFILE is '" + config.profile + "', which neither '" + credentials_file +
                     "' nor '" + config_file + "' defines");
  }

  const auto key_id = non_empty(env("AWS_ACCESS_KEY_ID"));
  const auto secret = non_empty(env("AWS_SECRET_ACCESS_KEY"));
  if (key_id && secret) {
    config.credentials = {*key_id, *secret, non_empty(env("AWS_SESSION_TOKEN")).value_or("")};
    config.credentials_from = "environment";
  } else {
    for (auto [settings, path] :
         {std::pair{&from_credentials, &credentials_file}, std::pair{&from_config, &config_file}}) {
      if (settings->count("aws_access_key_id") && settings->count("aws_secret_access_key")) {
        config.credentials = {
            (*settings)["aws_access_key_id"], (*settings)["aws_secret_access_key"],
            settings->count("aws_session_token") ? (*settings)["aws_session_token"] : ""};
        config.credentials_from = *path;
        break;
      }
    }
  }
  if (config.credentials_from.empty()) {
    return not_found(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile '" +
        config.profile + "' aws_access_key_id and aws_secret_access_key in '" + credentials_file +
        "' or '" + config_file + "'");
  }

  config.region = non_empty(env("AWS_REGION"))
                      .value_or(non_empty(env("AWS_DEFAULT_REGION"))
                                    .value_or(from_config.count("region") ? from_config["region"]
                                                                          : "us-east-1"));
  std::string endpoint_from = "AWS_ENDPOINT_URL_S3";
  auto endpoint = non_empty(env("AWS_ENDPOINT_URL_S3"));
  if (!endpoint) {
    endpoint_from = "AWS_ENDPOINT_URL";
    endpoint = non_empty(env("AWS_ENDPOINT_URL"));
  }
  if (!endpoint && from_config.count("endpoint_url")) {
    endpoint_from = "endpoint_url of profile '" + config.profile + "' in '" + config_file + "'";
    endpoint = from_config["endpoint_url"];
  }
  config.endpoint = endpoint.value_or("https://s3." + config.region + ".amazonaws.com");
  while (config.endpoint.ends_with('/')) config.endpoint.pop_back();
  if (!config.endpoint.starts_with("http://") && !config.endpoint.starts_with("https://")) {
    return invalid_argument(endpoint_from + " is '" + config.endpoint +
                            "': expected an http:// or https:// URL");
  }

  config.addressing =
      is_aws_endpoint(config.endpoint) ? S3Addressing::kVirtualHost : S3Addressing::kPath;
  if (from_config.count("s3.addressing_style") && from_config["s3.addressing_style"] != "auto") {
    ZW_ASSIGN_OR_RETURN(config.addressing,
                        parse_addressing(from_config["s3.addressing_style"],
                                         "s3.addressing_style of profile '" + config.profile +
                                             "' in '" + config_file + "'"));
  }
  if (auto style = non_empty(env("ZEROWAIT_S3_ADDRESSING"))) {
    ZW_ASSIGN_OR_RETURN(config.addressing, parse_addressing(*style, "ZEROWAIT_S3_ADDRESSING"));
  }
  return config;
}

}  // namespace zerowait::internal
