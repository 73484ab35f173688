// The field decoders' options as Python classes, and `decode={...}` specs made into FieldDecodes
// through the decoder registry.
#pragma once

#include <string>

#include "common.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

// Binds ImageTransform, DeviceImageTransform, TokenWindow, Array and AudioClip into `m`.
void bind_field_decoders(py::module_& m);

// The FieldDecode of `spec` (a decoder's name, or options bound by bind_field_decoders) for
// decode[`field`]; throws StatusError (InvalidArgumentError) naming both otherwise.
FieldDecode field_decode(py::handle spec, const std::string& field);

}  // namespace zerowait
