// zerowait._core._encode_state: the walk of a state in Checkpointer.save(), in C++.
//
// save() walks the caller's state into the list of tensors the engine copies and a JSON
// description of the rest (python/zerowait/_checkpoint_state.py, _Snapshot: the one definition of
// that format). In Python the walk cost about 15 us a tensor — a dozen attribute reads, a node
// dict, then json.dumps of the whole — so a state of thousands of small tensors spent tens of
// milliseconds in save() before any byte was copied. This walk reads the same attributes through
// the C API and writes the JSON as it goes. It takes the common nodes itself: dicts,
// OrderedDicts, lists, tuples, str, int, float, bool, None, and contiguous CPU tensors of a
// safetensors dtype; every other value (numpy arrays, DTensors, non-contiguous or CUDA tensors,
// big ints, pickled objects, ...) goes to _Snapshot._encode, whose node is serialized here. The
// tensor rows, names, guards and ownership lists are the snapshot's own Python lists, so both
// walks add to them alike.
#include <Python.h>

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "common.hpp"

namespace zerowait {
namespace {

py::object steal(PyObject* p) {
  if (p == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(p);
}

void check(int result) {
  if (result < 0) throw py::error_already_set();
}

// Attribute and method names, interned once.
struct Names {
  PyObject* layout = PyUnicode_InternFromString("layout");
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* is_contiguous = PyUnicode_InternFromString("is_contiguous");
  PyObject* is_neg = PyUnicode_InternFromString("is_neg");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* version = PyUnicode_InternFromString("_version");
  PyObject* is_inference = PyUnicode_InternFromString("is_inference");
  PyObject* requires_grad = PyUnicode_InternFromString("requires_grad");
  PyObject* metadata = PyUnicode_InternFromString("_metadata");
  PyObject* items = PyUnicode_InternFromString("items");
  PyObject* owner = PyUnicode_InternFromString("owner");
};

const Names& names() {
  static const Names* interned = new Names();  // never freed: the module lives as long
  return *interned;
}

// JSON text of a str (UTF-8, escaping what JSON requires); false when the str has no UTF-8 form
// (a lone surrogate), with the error cleared.
bool append_json_string(std::string& out, PyObject* str) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(str, &size);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  out += '"';
  for (Py_ssize_t i = 0; i < size; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return true;
}

template <typename Int>
void append_number(std::string& out, Int value) {
  char digits[24];
  auto [end, error] = std::to_chars(digits, digits + sizeof(digits), value);
  out.append(digits, end);
}

// An int the structure stores as itself (_int_node: 64 bits, signed or not); false otherwise.
bool append_int(std::string& out, PyObject* value) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    append_number(out, v);
    return true;
  }
  if (overflow < 0) return false;
  const unsigned long long u = PyLong_AsUnsignedLongLong(value);
  if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // beyond 64 bits
    return false;
  }
  append_number(out, u);
  return true;
}

uint64_t as_u64(PyObject* value) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(value);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    throw py::error_already_set();
  }
  return v;
}

class StateWalk {
 public:
  // context: (torch.Tensor, torch.nn.Parameter, torch.strided, the dtype facts table,
  // collections.OrderedDict, whether tensors may take the fast path); the types are None when
  // torch is not imported.
  StateWalk(py::handle snapshot, py::tuple context)
      : tensor_type_(context[0].ptr()),
        parameter_type_(context[1].ptr()),
        strided_(context[2].ptr()),
        dtype_facts_(context[3].ptr()),
        ordered_dict_type_(context[4].ptr()),
        fast_tensors_(context[5].cast<bool>() && tensor_type_ != Py_None),
        tensors_(snapshot.attr("tensors")),
        names_(snapshot.attr("_names")),
        keep_(snapshot.attr("_keep")),
        copy_now_(snapshot.attr("copy_now")),
        tracked_(snapshot.attr("tracked")),
        owners_(snapshot.attr("owners")),
        owned_(snapshot.attr("owned")),
        encode_(snapshot.attr("_encode")),
        refuse_key_(snapshot.attr("_refuse_key")),
        refuse_cycle_(snapshot.attr("_refuse_cycle")),
        dumps_(py::module_::import("json").attr("dumps")) {
    if (!owned_.is_none()) spans_ = owned_.attr("_spans");
    dumps_options_["allow_nan"] = false;
    dumps_options_["separators"] = py::make_tuple(",", ":");
  }

  std::string run(py::handle state) {
    out_.reserve(1 << 16);
    encode(state.ptr());
    return std::move(out_);
  }

 private:
  // A key of the path from the root: a dict key, or a list index.
  struct PathStep {
    PyObject* key;  // borrowed from the container, which stays alive on the path; or null
    Py_ssize_t index;
  };

  void encode(PyObject* obj) {
    PyTypeObject* kind = Py_TYPE(obj);
    if (reinterpret_cast<PyObject*>(kind) == tensor_type_ ||
        reinterpret_cast<PyObject*>(kind) == parameter_type_) {
      if (fast_tensors_ && tensor(obj, reinterpret_cast<PyObject*>(kind) == parameter_type_)) {
        return;
      }
    } else if (obj == Py_None) {
      out_ += "null";
      return;
    } else if (obj == Py_True || obj == Py_False) {
      out_ += obj == Py_True ? "true" : "false";
      return;
    } else if (kind == &PyUnicode_Type) {
      if (append_json_string(out_, obj)) return;
    } else if (kind == &PyLong_Type) {
      if (append_int(out_, obj)) return;
    } else if (kind == &PyFloat_Type) {
      const double value = PyFloat_AS_DOUBLE(obj);
      if (std::isfinite(value)) {  // as json.dumps writes it: float's repr
        char* text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
        if (text == nullptr) throw py::error_already_set();
        out_ += text;
        PyMem_Free(text);
        return;
      }
    } else if (kind == &PyDict_Type || kind == &PyList_Type || kind == &PyTuple_Type ||
               reinterpret_cast<PyObject*>(kind) == ordered_dict_type_) {
      container(obj, kind);
      return;
    }
    fallback(obj);
  }

  // Any other value: the Python walk's node for it, as json.dumps writes it.
  void fallback(PyObject* obj) {
    py::object node = encode_(py::handle(obj), path_tuple(), py::str(pointer_));
    out_ += dumps_(node, **dumps_options_).cast<std::string>();
  }

  void container(PyObject* obj, PyTypeObject* kind) {
    for (PyObject* open : open_) {
      if (open == obj) {
        refuse_cycle_(path_tuple());
        throw std::logic_error("_refuse_cycle returned");  // it raises
      }
    }
    if (Py_EnterRecursiveCall(" while walking the state to save")) throw py::error_already_set();
    open_.push_back(obj);
    try {
      if (kind == &PyList_Type || kind == &PyTuple_Type) {
        sequence(obj, kind == &PyList_Type);
      } else {
        mapping(obj, kind == &PyDict_Type);
      }
    } catch (...) {  // the walk is over; Python's recursion count is not
      Py_LeaveRecursiveCall();
      throw;
    }
    open_.pop_back();
    Py_LeaveRecursiveCall();
  }

  void sequence(PyObject* obj, bool is_list) {
    out_ += is_list ? R"({"type":"list","items":[)" : R"({"type":"tuple","items":[)";
    const size_t pointer_size = pointer_.size();
    // Sized each time round: a value handed to Python code could change a list.
    for (Py_ssize_t i = 0; i < (is_list ? PyList_GET_SIZE(obj) : PyTuple_GET_SIZE(obj)); ++i) {
      if (i > 0) out_ += ',';
      py::object item = py::reinterpret_borrow<py::object>(is_list ? PyList_GET_ITEM(obj, i)
                                                                   : PyTuple_GET_ITEM(obj, i));
      pointer_ += '/';
      append_number(pointer_, i);
      path_.push_back({nullptr, i});
      encode(item.ptr());
      path_.pop_back();
      pointer_.resize(pointer_size);
    }
    out_ += "]}";
  }

  void mapping(PyObject* obj, bool plain) {
    out_ += plain ? R"({"type":"dict","items":[)" : R"({"type":"odict","items":[)";
    // An OrderedDict's order is its own list's, not the dict underneath: iterate its items().
    py::object items = steal(PyObject_CallMethodNoArgs(obj, names().items));
    py::object iterator = steal(PyObject_GetIter(items.ptr()));
    const size_t pointer_size = pointer_.size();
    bool first = true;
    while (PyObject* raw = PyIter_Next(iterator.ptr())) {
      py::object pair = py::reinterpret_steal<py::object>(raw);
      PyObject* key = PyTuple_GET_ITEM(raw, 0);
      PyObject* value = PyTuple_GET_ITEM(raw, 1);
      out_ += first ? "[" : ",[";
      first = false;
      pointer_ += '/';
      if (Py_TYPE(key) == &PyUnicode_Type) {
        if (!append_json_string(out_, key)) fallback(key);
        append_pointer_token(key);
      } else if (Py_TYPE(key) == &PyLong_Type) {
        if (!append_int(out_, key)) fallback(key);
        py::object text = steal(PyObject_Str(key));
        append_pointer_token(text.ptr());
      } else {
        refuse_key_(path_tuple(), py::handle(key));
        throw std::logic_error("_refuse_key returned");  // it raises
      }
      out_ += ',';
      path_.push_back({key, 0});
      encode(value);
      path_.pop_back();
      pointer_.resize(pointer_size);
      out_ += ']';
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    out_ += ']';
    if (!plain) {  // what nn.Module.state_dict() attaches
      py::object metadata = py::getattr(py::handle(obj), names().metadata, py::none());
      if (!metadata.is_none()) {
        out_ += R"(,"metadata":)";
        pointer_ += "/_metadata";
        path_.push_back({names().metadata, 0});
        encode(metadata.ptr());
        path_.pop_back();
        pointer_.resize(pointer_size);
      }
    }
    out_ += '}';
  }

  // A key as one token of an RFC 6901 JSON pointer: ~ and / escaped (_escape).
  void append_pointer_token(PyObject* text) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    if (utf8 == nullptr) {  // a lone surrogate: as Python's own encoder would refuse it
      throw py::error_already_set();
    }
    for (Py_ssize_t i = 0; i < size; ++i) {
      if (utf8[i] == '~') {
        pointer_ += "~0";
      } else if (utf8[i] == '/') {
        pointer_ += "~1";
      } else {
        pointer_ += utf8[i];
      }
    }
  }

  // The fast path of _Snapshot._tensor: a contiguous CPU tensor of a dtype safetensors names,
  // read in place. False (nothing added) for every other tensor, which the Python walk takes.
  bool tensor(PyObject* t, bool parameter) {
    const Names& n = names();
    if (steal(PyObject_GetAttr(t, n.layout)).ptr() != strided_) return false;
    py::object dtype = steal(PyObject_GetAttr(t, n.dtype));
    // (name, safetensors name or None, bytes per grouped element, floating point, complex);
    // a dtype not yet in the table is put there by the Python walk.
    PyObject* facts = PyDict_GetItemWithError(dtype_facts_, dtype.ptr());
    if (facts == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return false;
    }
    PyObject* stored = PyTuple_GET_ITEM(facts, 1);
    if (stored == Py_None || PyTuple_GET_ITEM(facts, 4) == Py_True) return false;
    if (steal(PyObject_GetAttr(t, n.is_cpu)).ptr() != Py_True) return false;
    if (steal(PyObject_CallMethodNoArgs(t, n.is_contiguous)).ptr() != Py_True) return false;
    if (steal(PyObject_CallMethodNoArgs(t, n.is_neg)).ptr() != Py_False) return false;
    py::object shape = steal(PyObject_GetAttr(t, n.shape));
    const uint64_t address = as_u64(steal(PyObject_CallMethodNoArgs(t, n.data_ptr)).ptr());
    const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());  // torch.Size is a tuple
    py::object shape_list = steal(PyList_New(rank));
    // Contiguous and not complex: the bytes are the elements times the element size.
    uint64_t nbytes = as_u64(PyTuple_GET_ITEM(facts, 2));
    for (Py_ssize_t i = 0; i < rank; ++i) {
      PyObject* size = PyTuple_GET_ITEM(shape.ptr(), i);
      nbytes *= as_u64(size);
      Py_INCREF(size);
      PyList_SET_ITEM(shape_list.ptr(), i, size);
    }
    const Py_ssize_t index = add(t, stored, shape_list, facts, address, nbytes);

    out_ += R"({"type":"tensor","index":)";
    append_number(out_, index);
    out_ += R"(,"dtype":)";
    append_json_string(out_, PyTuple_GET_ITEM(facts, 0));
    out_ += R"(,"shape":[)";
    for (Py_ssize_t i = 0; i < rank; ++i) {
      if (i > 0) out_ += ',';
      append_int(out_, PyTuple_GET_ITEM(shape.ptr(), i));
    }
    out_ += R"(],"device":"cpu")";
    if (parameter) {
      const bool grad = steal(PyObject_GetAttr(t, n.requires_grad)).ptr() == Py_True;
      out_ += grad ? R"(,"parameter":true,"requires_grad":true)"
                   : R"(,"parameter":true,"requires_grad":false)";
    }
    out_ += '}';
    return true;
  }

  // _Snapshot._add for a tensor read in place at `address`: its row, its name (made unique as
  // there), and which list guards it.
  Py_ssize_t add(PyObject* t, PyObject* stored, const py::object& shape, PyObject* facts,
                 uint64_t address, uint64_t nbytes) {
    const Py_ssize_t index = PyList_GET_SIZE(tensors_.ptr());
    std::string text = pointer_.empty() ? "/" : pointer_;
    py::object name = steal(PyUnicode_FromStringAndSize(text.data(), text.size()));
    const int taken = PySet_Contains(names_.ptr(), name.ptr());
    check(taken);
    if (taken) {  // int key 0 and str key "0" of one dict share a pointer
      text += '#';
      append_number(text, index);
      name = steal(PyUnicode_FromStringAndSize(text.data(), text.size()));
    }
    check(PySet_Add(names_.ptr(), name.ptr()));
    check(PyList_Append(keep_.ptr(), t));
    py::tuple row = py::make_tuple(name, py::handle(stored), shape,
                                   py::handle(PyTuple_GET_ITEM(facts, 2)),
                                   py::handle(PyTuple_GET_ITEM(facts, 3)), address, nbytes);
    check(PyList_Append(tensors_.ptr(), row.ptr()));
    if (owned_.is_none() || address == 0) return index;
    py::object owner = owner_of(address, nbytes);
    py::object version;
    if (!owner.is_none()) {
      // Inference tensors keep no version count (reading it raises): nothing could tell a torn
      // copy, so they are copied now. Asked this way, not with is_inference(): one call less.
      version = py::reinterpret_steal<py::object>(PyObject_GetAttr(t, names().version));
      if (!version) {
        py::error_already_set error;  // taken out of Python's error indicator
        if (steal(PyObject_CallMethodNoArgs(t, names().is_inference)).ptr() != Py_True) {
          throw error;  // not why it failed: the error stands
        }
        owner = py::none();
      }
    }
    py::int_ position(index);
    if (owner.is_none()) {
      check(PyList_Append(copy_now_.ptr(), position.ptr()));
    } else {
      py::tuple guard = py::make_tuple(position, py::handle(t), version);
      check(PyList_Append(tracked_.ptr(), guard.ptr()));
      check(PySet_Add(owners_.ptr(), owner.ptr()));
    }
    return index;
  }

  // OwnedMemory.owner: a parameter's own address is a key of its spans; anything else (a view,
  // a piece) asks the Python method, which searches them.
  py::object owner_of(uint64_t address, uint64_t nbytes) {
    py::int_ start(address);
    PyObject* span = PyDict_GetItemWithError(spans_.ptr(), start.ptr());
    if (span == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return owned_.attr(names().owner)(start, nbytes);
    }
    const uint64_t end = as_u64(PyTuple_GET_ITEM(span, 0));
    return address + nbytes <= end ? py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(span, 1))
                                   : py::none();
  }

  // The path as the Python walk keeps it: a tuple of keys and indices (for its messages).
  py::tuple path_tuple() const {
    py::tuple path(path_.size());
    for (size_t i = 0; i < path_.size(); ++i) {
      path[i] = path_[i].key != nullptr ? py::reinterpret_borrow<py::object>(path_[i].key)
                                        : py::int_(path_[i].index);
    }
    return path;
  }

  PyObject* tensor_type_;
  PyObject* parameter_type_;
  PyObject* strided_;
  PyObject* dtype_facts_;
  PyObject* ordered_dict_type_;
  bool fast_tensors_;
  py::object tensors_, names_, keep_, copy_now_, tracked_, owners_, owned_, spans_;
  py::object encode_, refuse_key_, refuse_cycle_, dumps_;
  py::dict dumps_options_;
  std::string out_;
  std::string pointer_;  // the JSON pointer of the value being walked ("" the root)
  std::vector<PathStep> path_;
  std::vector<PyObject*> open_;  // the containers on the path, to refuse a state holding itself
};

}  // namespace

void bind_state_walk(py::module_& m) {
  m.def(
      "_encode_state",
      [](py::handle snapshot, py::handle state, py::tuple context) {
        // The walk makes a few tuples and lists per tensor, none of them garbage: collections
        // set off by their count found nothing and took a tenth of the walk.
        const int collecting = PyGC_Disable();
        std::string json;
        try {
          json = StateWalk(snapshot, context).run(state);
        } catch (...) {
          if (collecting) PyGC_Enable();
          throw;
        }
        if (collecting) PyGC_Enable();
        return steal(PyUnicode_FromStringAndSize(json.data(), json.size()));
      },
      py::arg("snapshot"), py::arg("state"), py::arg("context"),
      "The structure JSON of `state` (its root node) for _Snapshot.encode_state, adding its "
      "tensors to the snapshot's lists (python/state_walk.cpp).");
}

}  // namespace zerowait
