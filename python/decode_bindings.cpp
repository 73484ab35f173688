// Python bindings of the field decoders' options (zerowait.RandomResizedCrop / CenterCrop build
// an ImageTransform, TokenWindow, Array, AudioClip), and `decode={...}` specs made into
// FieldDecodes through the decoder registry (zerowait/loader/field_decoder.hpp): a string names a
// registered decoder; an options object names the decoder it was bound for here.
#include "decode_bindings.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <any>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/loader/array_field.hpp"
#include "zerowait/loader/audio_clip.hpp"
#include "zerowait/loader/image_transform.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/loader/token_window.hpp"

namespace zerowait {

namespace {

// zerowait.RandomResizedCrop(..., device="cuda"): the loader reads each JPEG's header and the
// GPU stage (zerowait/gpu_decode.py) decodes and crops it on `device`.
struct DeviceImageTransform {
  ImageTransform transform;
  std::string device;
};

std::string transform_repr(const ImageTransform& t, const std::string& device) {
  const bool rrc = t.mode == ImageTransform::Mode::kRandomResizedCrop;
  return std::string(rrc ? "RandomResizedCrop(" : "CenterCrop(") + std::to_string(t.size) +
         (t.random_flip ? ", flip=True" : "") + (t.dct_downscale ? "" : ", dct_downscale=False") +
         (device.empty() ? "" : ", device='" + device + "'") + ")";
}

// An options class bound here, and the registered decoder its objects are the options of.
struct OptionsClass {
  py::handle type;  // borrowed: the class lives as long as the module
  std::string decoder;
  std::any (*options)(py::handle spec);
};

std::vector<OptionsClass>& options_classes() {
  static std::vector<OptionsClass> classes;
  return classes;
}

// Objects of `cls` are the options of `decoder`: themselves, or what `options` makes of them.
template <typename Bound>
void decodes_as(
    const py::class_<Bound>& cls, const char* decoder,
    std::any (*options)(py::handle spec) = [](py::handle spec) {
      return std::any(spec.cast<Bound>());
    }) {
  options_classes().push_back({cls, decoder, options});
}

}  // namespace

FieldDecode field_decode(py::handle spec, const std::string& field) {
  if (py::isinstance<py::str>(spec)) {
    const std::string name = spec.cast<std::string>();
    const std::vector<std::string> names = field_decoder_names();
    if (std::find(names.begin(), names.end(), name) != names.end()) return {name, {}};
  }
  for (const OptionsClass& c : options_classes()) {
    if (py::isinstance(spec, c.type)) return {c.decoder, c.options(spec)};
  }
  std::string names, classes;
  for (const std::string& name : field_decoder_names()) {
    names += (names.empty() ? "\"" : ", \"") + name + "\"";
  }
  for (const OptionsClass& c : options_classes()) {
    classes += (classes.empty() ? "" : ", ") + std::string("zerowait.") +
               c.type.attr("__name__").cast<std::string>();
  }
  throw StatusError(invalid_argument("decode['" + field + "'] must be a decoder's name (" + names +
                                     ") or decoder options (" + classes + "), not " +
                                     py::repr(spec).cast<std::string>()));
}

void bind_field_decoders(py::module_& m) {
  // The keyword defaults Python shows are the C++ defaults (one source).
  const ImageTransform image_defaults;

  auto image =
      py::class_<ImageTransform>(m, "ImageTransform", R"doc(
How a JPEG field becomes a uint8 [size, size, 3] image. Build one with
zerowait.RandomResizedCrop(...) or zerowait.CenterCrop(...).
)doc")
          .def(py::init([](const std::string& mode, int size, int resize, double scale_min,
                           double scale_max, double ratio_min, double ratio_max, bool flip,
                           bool dct_downscale) {
                 ImageTransform t;
                 if (mode == "random_resized_crop") {
                   t.mode = ImageTransform::Mode::kRandomResizedCrop;
                 } else if (mode == "center_crop") {
                   t.mode = ImageTransform::Mode::kResizeCenterCrop;
                 } else {
                   throw StatusError(invalid_argument("unknown image mode '" + mode +
                                                      "' (random_resized_crop or center_crop)"));
                 }
                 t.size = size;
                 t.resize = resize;
                 t.scale_min = scale_min;
                 t.scale_max = scale_max;
                 t.ratio_min = ratio_min;
                 t.ratio_max = ratio_max;
                 t.random_flip = flip;
                 t.dct_downscale = dct_downscale;
                 throw_if_error(t.validate());
                 return t;
               }),
               py::arg("mode"), py::arg("size"), py::arg("resize") = image_defaults.resize,
               py::arg("scale_min") = image_defaults.scale_min,
               py::arg("scale_max") = image_defaults.scale_max,
               py::arg("ratio_min") = image_defaults.ratio_min,
               py::arg("ratio_max") = image_defaults.ratio_max,
               py::arg("flip") = image_defaults.random_flip,
               py::arg("dct_downscale") = image_defaults.dct_downscale)
          .def_readonly("size", &ImageTransform::size)
          .def_readonly("flip", &ImageTransform::random_flip)
          .def_readonly("dct_downscale", &ImageTransform::dct_downscale)
          .def_property_readonly("mode",
                                 [](const ImageTransform& t) {
                                   return t.mode == ImageTransform::Mode::kRandomResizedCrop
                                              ? "random_resized_crop"
                                              : "center_crop";
                                 })
          .def(
              "crop_area",
              [](const ImageTransform& t, int width, int height, uint64_t seed, uint64_t epoch,
                 uint64_t index) {
                if (width <= 0 || height <= 0) {
                  throw StatusError(
                      invalid_argument("crop_area needs a positive width and height, "
                                       "got " +
                                       std::to_string(width) + "x" + std::to_string(height)));
                }
                const CropArea a = crop_area(width, height, t, augment_seed(seed, epoch, index));
                return py::make_tuple(a.x0, a.y0, a.x1, a.y1, a.flip);
              },
              py::arg("width"), py::arg("height"), py::arg("seed") = 0, py::arg("epoch") = 0,
              py::arg("index") = 0, R"doc(
The area (x0, y0, x1, y1, flip) of a width x height image that a Loader with this ``seed``
shows of sample ``index`` in ``epoch``, in pixels of the full-resolution image (fractional for
CenterCrop), and whether it is mirrored: what the ``"<field>.crop"`` column of a GPU-decoded
field holds.
)doc")
          .def("__repr__", [](const ImageTransform& t) { return transform_repr(t, ""); });

  auto device_image =
      py::class_<DeviceImageTransform>(m, "DeviceImageTransform", R"doc(
An ImageTransform decoded on a GPU: zerowait.RandomResizedCrop(..., device="cuda"). The loader's
threads read only each JPEG's header and deliver its bytes with the crop to take; zerowait's
GPU stage decodes and crops them on ``device`` (docs/loader.md, "GPU JPEG decode").
)doc")
          .def(py::init([](const ImageTransform& transform, const std::string& device) {
                 return DeviceImageTransform{transform, device};
               }),
               py::arg("transform"), py::arg("device"))
          .def_property_readonly("transform",
                                 [](const DeviceImageTransform& d) { return d.transform; })
          .def_readonly("device", &DeviceImageTransform::device)
          .def_property_readonly("size",
                                 [](const DeviceImageTransform& d) { return d.transform.size; })
          .def("__repr__",
               [](const DeviceImageTransform& d) { return transform_repr(d.transform, d.device); });

  const TokenWindow token_defaults;
  auto tokens =
      py::class_<TokenWindow>(m, "TokenWindow", R"doc(
How a field holding a token sequence (a little-endian uint16, uint32 or int32 array, no header)
becomes a row of an int64 [batch, seq_len] tensor (int32 with ``out_dtype="int32"``: half the
bytes), with "<field>.lengths" (int64 [batch]) the
tokens of each row before its padding. Shorter sequences are padded with ``pad``; longer ones are
cut to ``seq_len`` tokens from their start, or with ``random_offset=True`` from an offset drawn
from (seed, epoch, sample index): the same after an exact resume. docs/loader.md.
)doc")
          .def(py::init([](uint32_t seq_len, const std::string& dtype, int64_t pad,
                           bool random_offset, const std::string& out_dtype) {
                 TokenWindow t;
                 t.seq_len = seq_len;
                 t.dtype = value_or_throw(parse_token_dtype(dtype));
                 t.pad = pad;
                 t.random_offset = random_offset;
                 if (out_dtype != "int64" && out_dtype != "int32") {
                   throw StatusError(
                       invalid_argument("TokenWindow out_dtype must be \"int64\" or "
                                        "\"int32\", not \"" +
                                        out_dtype + "\""));
                 }
                 t.int32_rows = out_dtype == "int32";
                 throw_if_error(t.validate());
                 return t;
               }),
               py::arg("seq_len"), py::arg("dtype") = token_dtype_name(token_defaults.dtype),
               py::arg("pad") = token_defaults.pad,
               py::arg("random_offset") = token_defaults.random_offset,
               py::arg("out_dtype") = "int64")
          .def_readonly("seq_len", &TokenWindow::seq_len)
          .def_property_readonly("dtype",
                                 [](const TokenWindow& t) { return token_dtype_name(t.dtype); })
          .def_readonly("pad", &TokenWindow::pad)
          .def_readonly("random_offset", &TokenWindow::random_offset)
          .def_property_readonly(
              "out_dtype", [](const TokenWindow& t) { return t.int32_rows ? "int32" : "int64"; })
          .def("__repr__", [](const TokenWindow& t) {
            return "TokenWindow(" + std::to_string(t.seq_len) + ", dtype='" +
                   token_dtype_name(t.dtype) + "', pad=" + std::to_string(t.pad) +
                   (t.random_offset ? ", random_offset=True" : "") +
                   (t.int32_rows ? ", out_dtype='int32')" : ")");
          });

  auto array =
      py::class_<ArrayField>(m, "Array", R"doc(
How a field holding one NumPy array a sample becomes a row of a [batch, *shape] tensor: the
.npy format (numpy.save; what zerowait.write_dataset stores arrays and tensors as), or with
``header=False`` the bare bytes of an array of ``dtype`` and ``shape``. Without ``dtype`` the
first sample that has the field sets dtype and shape; every sample must match them, or it is a
corrupt sample (on_corrupt). Rows are copied as stored (C order, little-endian). docs/loader.md.
)doc")
          .def(py::init([](std::optional<std::string> dtype,
                           std::optional<std::vector<int64_t>> shape, bool header) {
                 ArrayField a;
                 if (dtype) a.dtype = value_or_throw(parse_dtype(*dtype));
                 if (shape && !dtype) {
                   throw StatusError(invalid_argument("Array(shape=...) needs a dtype as well"));
                 }
                 if (dtype && !shape) {
                   throw StatusError(invalid_argument("Array(dtype=...) needs a shape as well"));
                 }
                 if (shape) a.shape = *shape;
                 a.header = header;
                 throw_if_error(a.validate());
                 return a;
               }),
               py::arg("dtype") = py::none(), py::arg("shape") = py::none(),
               py::arg("header") = true)
          .def_property_readonly("dtype",
                                 [](const ArrayField& a) -> py::object {
                                   if (!a.dtype) return py::none();
                                   return py::str(dtype_name(*a.dtype));
                                 })
          .def_property_readonly("shape",
                                 [](const ArrayField& a) -> py::object {
                                   if (!a.dtype) return py::none();
                                   return py::tuple(py::cast(a.shape));
                                 })
          .def_readonly("header", &ArrayField::header)
          .def("__repr__", [](const ArrayField& a) {
            if (!a.dtype) return std::string(a.header ? "Array()" : "Array(header=False)");
            std::string shape = "(";
            for (size_t i = 0; i < a.shape.size(); ++i) {
              shape += (i ? ", " : "") + std::to_string(a.shape[i]);
            }
            shape += a.shape.size() == 1 ? ",)" : ")";
            return "Array(dtype='" + std::string(dtype_name(*a.dtype)) + "', shape=" + shape +
                   (a.header ? ")" : ", header=False)");
          });

  const AudioClip audio_defaults;
  auto audio = py::class_<AudioClip>(m, "AudioClip", R"doc(
How a field holding an audio file (WAV, FLAC, Ogg/Vorbis: whatever libsndfile reads) becomes a
row of a float32 [batch, channels, length] tensor, with "<field>.lengths" (int64 [batch]) the
frames of each row before its zero padding. Longer clips are cut to ``length`` frames, centred,
or with ``random_crop=True`` at an offset drawn from (seed, epoch, sample index): the same after
an exact resume; only those frames are decoded. ``channels=1`` averages a multi-channel file
down to mono; other counts must match the file. ``sample_rate`` (0: any) refuses files at
another rate: there is no resampling. A file that cannot be read is a corrupt sample.
docs/loader.md.
)doc")
                   .def(py::init([](uint32_t length, uint32_t channels, uint32_t sample_rate,
                                    bool random_crop) {
                          AudioClip a;
                          a.length = length;
                          a.channels = channels;
                          a.sample_rate = sample_rate;
                          a.random_crop = random_crop;
                          throw_if_error(a.validate());
                          return a;
                        }),
                        py::arg("length"), py::arg("channels") = audio_defaults.channels,
                        py::arg("sample_rate") = audio_defaults.sample_rate,
                        py::arg("random_crop") = audio_defaults.random_crop)
                   .def_readonly("length", &AudioClip::length)
                   .def_readonly("channels", &AudioClip::channels)
                   .def_readonly("sample_rate", &AudioClip::sample_rate)
                   .def_readonly("random_crop", &AudioClip::random_crop)
                   .def("__repr__", [](const AudioClip& a) {
                     return "AudioClip(" + std::to_string(a.length) +
                            ", channels=" + std::to_string(a.channels) +
                            ", sample_rate=" + std::to_string(a.sample_rate) +
                            (a.random_crop ? ", random_crop=True)" : ")");
                   });

  decodes_as(image, "image");
  decodes_as(device_image, "image_device", [](py::handle spec) {
    return std::any(spec.cast<DeviceImageTransform>().transform);  // `device` is Python's
  });
  decodes_as(tokens, "tokens");
  decodes_as(array, "array");
  decodes_as(audio, "audio");
}

}  // namespace zerowait
