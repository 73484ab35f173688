// Integers read from JSON records on disk (manifests, checkpoint records).
//
// nlohmann's get<uint64_t>() converts whatever number it finds: a stored 5e22 is undefined
// behaviour and -1 wraps to 2^64-1. A record is untrusted input, so its integer fields go through
// these instead: they accept only an integer that fits the type and otherwise throw
// json::type_error, which the callers already turn into a "corrupt record" error naming the file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zerowait::internal {

template <typename T, typename Json>
T json_integer(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.template get<uint64_t>();
    if (std::in_range<T>(v)) return static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.template get<int64_t>();
    if (std::in_range<T>(v)) return static_cast<T>(v);
  }
  throw Json::type_error::create(302,
                                 "expected an integer that fits " + std::to_string(sizeof(T) * 8) +
                                     (std::is_signed_v<T> ? " signed" : " unsigned") +
                                     " bits, found " + value.dump(),
                                 &value);
}

template <typename T, typename Json>
std::vector<T> json_integers(const Json& value) {
  if (!value.is_array()) {
    throw Json::type_error::create(302, "expected a list of integers, found " + value.dump(),
                                   &value);
  }
  std::vector<T> out;
  out.reserve(value.size());
  for (const Json& element : value) out.push_back(json_integer<T>(element));
  return out;
}

}  // namespace zerowait::internal
