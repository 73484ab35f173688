// The network checks: interfaces (state, MTU, speed), RDMA ports, and the NCCL / Gloo / PyTorch
// variables that pick an interface, disable a transport or slow every step.
#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

#include "diagnose/doctor/pci.hpp"
#include "diagnose/doctor/checks.hpp"

namespace zerowait::doctor {
namespace {

constexpr const char* kNetworkArea = "network";
constexpr const char* kRdmaClass = "/sys/class/infiniband";

struct Interface {
  std::string name;
  std::string operstate;  // "up", "down", "unknown" (lo, some virtual ones)
  std::optional<int64_t> mtu;
  std::optional<int64_t> speed_mbps;  // nullopt when unreadable or -1 (virtual, link down)
  std::string type;                   // ARPHRD: "1" Ethernet, "32" InfiniBand
  bool physical = false;              // has a `device` link
  std::string pci_address;            // "" when not on PCI
};

struct RdmaPort {
  std::string device;  // "mlx5_0"
  int port = 0;
  std::string state;       // "ACTIVE", "DOWN", "INIT"...; "" when unreadable
  bool state_denied = false;  // the state file is there but this user may not read it
  std::string state_line;  // as read: "4: ACTIVE"
  std::string link_layer;  // "InfiniBand", "Ethernet"
  std::string rate;        // "200 Gb/sec (4X HDR)"
};

std::string join(const std::vector<std::string>& items, const char* separator = ", ") {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

std::vector<Interface> read_interfaces(const System& system) {
  std::vector<Interface> interfaces;
  for (const std::string& name : system.list(kNetClass)) {
    const std::string dir = std::string(kNetClass) + "/" + name;
    Interface i;
    i.name = name;
    i.operstate = system.read_line(dir + "/operstate").value_or("unknown");
    i.mtu = system.read_int(dir + "/mtu");
    i.speed_mbps = system.read_int(dir + "/speed");
    if (i.speed_mbps && *i.speed_mbps <= 0) i.speed_mbps.reset();
    i.type = system.read_line(dir + "/type").value_or("");
    i.physical = system.exists(dir + "/device");
    if (const std::optional<PciFunction> pci = pci_function_of(system, dir + "/device")) {
      i.pci_address = pci->address;
    }
    interfaces.push_back(std::move(i));
  }
  return interfaces;
}

std::vector<RdmaPort> read_rdma_ports(const System& system) {
  std::vector<RdmaPort> ports;
  for (const std::string& device : system.list(kRdmaClass)) {
    const std::string dir = std::string(kRdmaClass) + "/" + device + "/ports/";
    for (const std::string& port : system.list(dir)) {
      RdmaPort p;
      p.device = device;
      p.port = std::atoi(port.c_str());
      p.state_line = system.read_line(dir + port + "/state").value_or("");
      p.state_denied = p.state_line.empty() && system.denied(dir + port + "/state");
      const size_t colon = p.state_line.find(':');
      p.state = colon == std::string::npos ? p.state_line : p.state_line.substr(colon + 1);
      p.state.erase(0, p.state.find_first_not_of(' '));
      p.link_layer = system.read_line(dir + port + "/link_layer").value_or("?");
      p.rate = system.read_line(dir + port + "/rate").value_or("");
      ports.push_back(std::move(p));
    }
  }
  return ports;
}

// Interfaces that carry this host's containers' or VMs' traffic, never another node's.
bool is_local_bridge(const std::string& name) {
  for (const char* prefix : {"docker", "virbr", "veth", "br-", "cni", "flannel"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return name == "lo";
}

bool is_up(const std::string& operstate) { return operstate == "up"; }

// NCCL's interface and HCA lists (NCCL_SOCKET_IFNAME, NCCL_IB_HCA): comma-separated prefixes,
// each with an optional ":port"; a leading '^' selects what does not match, a leading '=' (after
// any '^') makes the entries exact names. Mirrors NCCL's parseStringList / matchIfList.
struct NcclList {
  bool exclude = false;
  bool exact = false;
  std::vector<std::pair<std::string, int>> entries;  // name, port (-1: any)

  explicit NcclList(std::string value) {
    if (!value.empty() && value[0] == '^') exclude = true, value.erase(0, 1);
    if (!value.empty() && value[0] == '=') exact = true, value.erase(0, 1);
    std::istringstream items(value);
    for (std::string item; std::getline(items, item, ',');) {
      const size_t colon = item.find(':');
      const int port = colon == std::string::npos ? -1 : std::atoi(item.c_str() + colon + 1);
      if (colon != std::string::npos) item.resize(colon);
      if (!item.empty()) entries.emplace_back(item, port);
    }
  }

  // Whether the list selects interface or device `name` (port -1: any port).
  bool selects(const std::string& name, int port = -1) const {
    const bool matched = std::any_of(entries.begin(), entries.end(), [&](const auto& entry) {
      const bool name_matches = exact ? name == entry.first : name.rfind(entry.first, 0) == 0;
      return name_matches && (entry.second == -1 || port == -1 || entry.second == port);
    });
    return matched != exclude;
  }
};

void check_interfaces(const System& system, const std::vector<Interface>& interfaces,
                      FindingList& list) {
  std::vector<std::string> all_names;
  for (const Interface& i : interfaces) {
    all_names.push_back(i.name);
    if (i.name == "lo") continue;
    std::string summary = i.name + ": " + i.operstate;
    if (i.mtu) summary += ", mtu " + std::to_string(*i.mtu);
    if (i.speed_mbps) summary += ", " + std::to_string(*i.speed_mbps) + " Mb/s";
    summary += i.physical ? ", physical" : ", virtual";
    if (!i.pci_address.empty()) summary += " (" + i.pci_address + ")";
    Finding& f = list.add("interfaces", Severity::kInfo, summary);
    f.subject = i.name;
    f.evidence = std::string(kNetClass) + "/" + i.name + ": operstate " + i.operstate + ", mtu " +
                 (i.mtu ? std::to_string(*i.mtu) : "?") + ", speed " +
                 (i.speed_mbps ? std::to_string(*i.speed_mbps) : "unreadable or -1") + ", type " +
                 (i.type.empty() ? "?" : i.type) +
                 (i.physical ? ", device link present" : ", no device link");
  }
  if (all_names.size() == size_t(std::count(all_names.begin(), all_names.end(), "lo"))) {
    Finding& f = list.add("interfaces", Severity::kInfo, "no network interface but lo");
    f.evidence = std::string(kNetClass) + ": " + (all_names.empty() ? "empty" : join(all_names));
    if (system.denied(kNetClass)) not_readable(f, "network interfaces", kNetClass);
    return;
  }
  // MTUs compared among up physical interfaces of one link type: IPoIB's 2044/4092 next to
  // Ethernet's 9000 is normal, not a mismatch.
  std::map<std::string, std::vector<const Interface*>> up_by_type;
  for (const Interface& i : interfaces) {
    if (i.physical && is_up(i.operstate) && i.mtu) up_by_type[i.type].push_back(&i);
  }
  for (const auto& [type, group] : up_by_type) {
    if (group.size() < 2) continue;
    int64_t largest = 0;
    std::vector<std::string> names;
    std::vector<std::string> pairs;
    for (const Interface* i : group) {
      largest = std::max(largest, *i->mtu);
      names.push_back(i->name);
      pairs.push_back(i->name + " " + std::to_string(*i->mtu));
    }
    const std::string evidence =
        std::string(kNetClass) + "/*/mtu of the up physical interfaces: " + join(pairs);
    std::vector<std::string> fixes;
    for (const Interface* i : group) {
      if (*i->mtu != largest) {
        fixes.push_back("ip link set dev " + i->name + " mtu " + std::to_string(largest));
      }
    }
    if (fixes.empty()) {
      Finding& f = list.add("interfaces", Severity::kOk,
                            join(names, " and ") + " share MTU " + std::to_string(largest));
      f.subject = join(names);
      f.evidence = evidence;
      continue;
    }
    Finding& f = list.add("interfaces", Severity::kWarn,
                          join(pairs) + ": a job whose ranks use different ones drops large "
                                        "packets");
    f.subject = join(names);
    f.evidence = evidence;
    f.why = "frames larger than the smaller MTU are dropped or fragmented between ranks, so "
            "collectives stall on retransmits or hang at init";
    f.fix = join(fixes, "; ") + " (and the same on every node and switch port)";
  }
}

void check_rdma(const System& system, const std::vector<RdmaPort>& ports, FindingList& list) {
  if (ports.empty()) {
    Finding& f =
        list.add("rdma", Severity::kInfo, "no RDMA devices: NCCL uses TCP sockets between nodes");
    f.evidence = std::string(kRdmaClass) + ": absent or no ports";
    if (system.denied(kRdmaClass)) not_readable(f, "RDMA devices", kRdmaClass);
    return;
  }
  for (const RdmaPort& p : ports) {
    const std::string path =
        std::string(kRdmaClass) + "/" + p.device + "/ports/" + std::to_string(p.port);
    if (p.state_denied) {
      Finding& f = not_readable(list.add("rdma", Severity::kInfo, ""),
                                p.device + " port " + std::to_string(p.port), path + "/state");
      f.subject = p.device + ":" + std::to_string(p.port);
      continue;
    }
    const bool active = p.state == "ACTIVE";
    Finding& f = list.add("rdma", active ? Severity::kInfo : Severity::kWarn,
                          p.device + " port " + std::to_string(p.port) + ": " +
                              (p.state.empty() ? "state unreadable" : p.state) + " (" +
                              p.link_layer + (p.rate.empty() ? "" : ", " + p.rate) + ")");
    f.subject = p.device + ":" + std::to_string(p.port);
    f.evidence = path + "/state: " + (p.state_line.empty() ? "unreadable" : p.state_line) +
                 ", link_layer: " + p.link_layer;
    if (active) continue;
    f.why = "NCCL uses only ACTIVE ports; with none it falls back to TCP sockets, many times "
            "slower for gradient all-reduce";
    f.fix = p.link_layer == "Ethernet"
                ? "bring the port's interface up (ip link set dev <if> up) and check the cable "
                  "(ibstat " + p.device + ")"
                : "check the cable and that a subnet manager runs on the fabric (ibstat " +
                      p.device + "; systemctl start opensm)";
  }
}

// NCCL_SOCKET_IFNAME (NCCL's list syntax) and GLOO_SOCKET_IFNAME (exact names: Gloo opens a
// device for each and fails on any that is missing).
void check_socket_ifname(const System& system, const std::map<std::string, std::string>& env,
                         const std::vector<Interface>& interfaces, FindingList& list) {
  // Without the interface list no setting can be judged (every name would look missing).
  const bool interfaces_denied = interfaces.empty() && system.denied(kNetClass);
  std::vector<std::string> all_names;
  std::vector<std::string> states;  // "eth0 up", as evidence
  std::vector<std::string> usable;  // what a fix can suggest: up, and not a bridge
  for (const Interface& i : interfaces) {
    all_names.push_back(i.name);
    states.push_back(i.name + " " + i.operstate);
    if (is_up(i.operstate) && !is_local_bridge(i.name)) usable.push_back(i.name);
  }
  const std::string suggestion =
      usable.empty() ? "<an interface that reaches the other nodes>" : join(usable, ",");
  const auto is_down = [&](const std::string& name) {
    return std::any_of(interfaces.begin(), interfaces.end(), [&](const Interface& i) {
      return i.name == name && !is_up(i.operstate) && i.operstate != "unknown";
    });
  };
  for (const char* variable : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    const bool nccl = variable[0] == 'N';
    const auto it = env.find(variable);
    if (it == env.end() || it->second.empty()) {
      Finding& f = list.add("nccl_socket_ifname", Severity::kInfo,
                            std::string(variable) +
                                (nccl ? " unset: NCCL takes ib* interfaces, else any but docker* "
                                        "and lo"
                                      : " unset: Gloo uses the interface of the host name's "
                                        "address"));
      f.subject = variable;
      f.evidence = std::string(variable) + ": not in the environment";
      continue;
    }
    const std::string setting = std::string(variable) + "=" + it->second;
    if (interfaces_denied) {
      Finding& f = not_readable(list.add("nccl_socket_ifname", Severity::kInfo, ""),
                                setting + ": the interfaces", kNetClass);
      f.subject = variable;
      continue;
    }
    const NcclList selection(nccl ? it->second : "=" + it->second);
    std::vector<std::string> selected;
    for (const Interface& i : interfaces) {
      if (selection.selects(i.name)) selected.push_back(i.name);
    }
    std::vector<std::string> missing;  // named, not there
    for (const auto& entry : selection.entries) {
      // Not a structured binding: clang 14 cannot capture one in the lambda below.
      const std::string& name = entry.first;
      const bool found = selection.exact
                             ? std::count(all_names.begin(), all_names.end(), name) != 0
                             : std::any_of(all_names.begin(), all_names.end(),
                                           [&](const std::string& n) {
                                             return n.rfind(name, 0) == 0;
                                           });
      if (!found) missing.push_back(name + (selection.exact ? "" : "*"));
    }
    Severity severity = Severity::kOk;
    std::string summary = setting + " selects " + join(selected);
    std::string why;
    // NCCL uses whatever matches; Gloo needs every name.
    if (selected.empty() || (!nccl && !missing.empty())) {
      severity = Severity::kFail;
      const std::string what = nccl && selection.exclude ? "it excludes every interface"
                                                         : "no interface " + join(missing, " or ");
      summary = setting + " but " + what + ": " +
                (nccl ? "NCCL fails at init or falls back" : "Gloo fails at init");
      why = "the process group cannot open a socket on the named interface: init_process_group "
            "raises, or hangs until its timeout";
    } else if (std::all_of(selected.begin(), selected.end(), is_local_bridge)) {
      severity = Severity::kWarn;
      summary = setting + " selects only " + join(selected) +
                ": traffic goes through a container bridge or loopback";
      why = "a bridge or loopback interface does not reach other nodes, or reaches them through "
            "NAT at a fraction of the NIC's speed";
    } else if (std::all_of(selected.begin(), selected.end(), [&](const std::string& name) {
                 return is_local_bridge(name) || is_down(name);
               })) {
      severity = Severity::kWarn;
      summary = setting + " selects only " + join(selected) +
                ": none is up and reaches other nodes";
      why = "an interface that is down carries nothing, and loopback or a bridge does not leave "
            "the host: init_process_group fails or times out";
    }
    Finding& f = list.add("nccl_socket_ifname", severity, summary);
    f.subject = variable;
    f.evidence = setting + " (environment); " + kNetClass + ": " + join(states);
    f.why = why;
    if (severity != Severity::kOk) f.fix = "export " + std::string(variable) + "=" + suggestion;
  }
}

void check_ib_hca(const System& system, const std::map<std::string, std::string>& env,
                  const std::vector<RdmaPort>& ports, FindingList& list) {
  const auto it = env.find("NCCL_IB_HCA");
  std::vector<std::string> all_ports;
  for (const RdmaPort& p : ports) all_ports.push_back(p.device + ":" + std::to_string(p.port));
  const std::string found =
      std::string(kRdmaClass) + ": " + (all_ports.empty() ? "no ports" : join(all_ports));
  if (it == env.end() || it->second.empty()) {
    Finding& f = list.add("nccl_ib_hca", Severity::kInfo,
                          ports.empty() ? "NCCL_IB_HCA unset (no RDMA device)"
                                        : "NCCL_IB_HCA unset: NCCL uses every ACTIVE RDMA port");
    f.subject = "NCCL_IB_HCA";
    f.evidence = "NCCL_IB_HCA: not in the environment; " + found;
    return;
  }
  const std::string setting = "NCCL_IB_HCA=" + it->second;
  if (ports.empty() && system.denied(kRdmaClass)) {
    not_readable(list.add("nccl_ib_hca", Severity::kInfo, ""), setting + ": the RDMA ports",
                 kRdmaClass)
        .subject = "NCCL_IB_HCA";
    return;
  }
  const NcclList selection(it->second);
  std::vector<std::string> selected;
  bool any_active = false;
  for (const RdmaPort& p : ports) {
    if (!selection.selects(p.device, p.port)) continue;
    selected.push_back(p.device + ":" + std::to_string(p.port));
    any_active = any_active || p.state == "ACTIVE";
  }
  const std::string evidence = setting + " (environment); " + found;
  const std::string fix =
      "export NCCL_IB_HCA=" +
      (all_ports.empty() ? std::string("<a device of ") + kRdmaClass + ">" : join(all_ports, ",")) +
      ", or unset NCCL_IB_HCA";
  if (selected.empty()) {
    Finding& f = list.add("nccl_ib_hca", Severity::kFail,
                          setting + " selects no RDMA port: NCCL falls back to TCP sockets");
    f.subject = "NCCL_IB_HCA";
    f.evidence = evidence;
    f.why = "with no InfiniBand/RoCE device NCCL sends every collective over TCP sockets, many "
            "times slower, or fails where the job requires IB";
    f.fix = fix;
    return;
  }
  Finding& f =
      list.add("nccl_ib_hca", any_active ? Severity::kOk : Severity::kWarn,
               setting + " selects " + join(selected) + (any_active ? "" : ", none ACTIVE"));
  f.subject = "NCCL_IB_HCA";
  f.evidence = evidence;
  if (!any_active) {
    f.why = "NCCL uses only ACTIVE ports; with none it falls back to TCP sockets";
    f.fix = fix;
  }
}

bool same_text(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }
bool is_set_flag(const std::string& value) { return std::atoll(value.c_str()) != 0; }

// A variable that slows every step when set: which values, and what they do.
struct SlowVariable {
  const char* name;
  bool (*slows)(const std::string& value);
  const char* why;
};

constexpr const char* kBlockingWaitWhy =
    "each wait on a collective blocks the host thread until the GPU finishes it, so the next "
    "work is not queued meanwhile; TORCH_NCCL_ASYNC_ERROR_HANDLING gives timeouts without it";

const SlowVariable kSlowVariables[] = {
    {"NCCL_DEBUG",
     [](const std::string& v) { return same_text(v, "INFO") || same_text(v, "TRACE"); },
     "every rank writes NCCL's setup and transport lines (TRACE: every call) into the job's "
     "output: slower start-up, and real errors buried"},
    {"TORCH_DISTRIBUTED_DEBUG",
     [](const std::string& v) { return same_text(v, "DETAIL") || same_text(v, "INFO"); },
     "DETAIL checks every collective's consistency with an extra collective and logs DDP each "
     "step; INFO logs DDP's statistics: debugging settings left on"},
    {"TORCH_CPP_LOG_LEVEL", [](const std::string& v) { return same_text(v, "INFO"); },
     "PyTorch's C++ side logs every INFO message (process groups, the NCCL watchdog) to stderr"},
    {"CUDA_LAUNCH_BLOCKING", is_set_flag,
     "serialises every kernel: each launch waits for the GPU to finish, so the CPU never runs "
     "ahead and data transfers never overlap compute"},
    {"PYTORCH_NO_CUDA_MEMORY_CACHING", is_set_flag,
     "turns off PyTorch's caching allocator: every tensor allocation calls cudaMalloc/cudaFree, "
     "which synchronise the device"},
    {"NCCL_P2P_DISABLE", is_set_flag,
     "GPUs of one node exchange data through host memory instead of NVLink or PCIe peer to peer"},
    {"NCCL_SHM_DISABLE", is_set_flag,
     "ranks of one node that cannot use P2P talk through the network stack instead of shared "
     "memory"},
    {"NCCL_IB_DISABLE", is_set_flag,
     "NCCL ignores the RDMA devices and sends every collective between nodes over TCP sockets"},
    {"NCCL_BLOCKING_WAIT", is_set_flag, kBlockingWaitWhy},
    {"TORCH_NCCL_BLOCKING_WAIT", is_set_flag, kBlockingWaitWhy},
};

void check_debug_variables(const std::map<std::string, std::string>& env, bool rdma_present,
                           FindingList& list) {
  size_t reported = 0;
  std::vector<std::string> names;
  for (const SlowVariable& variable : kSlowVariables) {
    names.push_back(variable.name);
    const auto it = env.find(variable.name);
    if (it == env.end() || !variable.slows(it->second)) continue;
    const std::string name = variable.name;
    const std::string setting = name + "=" + it->second;
    ++reported;
    // Logs kept out of the job's output, or a transport that is not there anyway: a fact only.
    const auto debug_file = env.find("NCCL_DEBUG_FILE");
    if (name == "NCCL_DEBUG" && !same_text(it->second, "TRACE") && debug_file != env.end()) {
      Finding& f = list.add("debug_variables", Severity::kInfo,
                            setting + " logs to NCCL_DEBUG_FILE=" + debug_file->second);
      f.subject = name;
      f.evidence = setting + ", NCCL_DEBUG_FILE=" + debug_file->second + " (environment)";
      continue;
    }
    if (name == "NCCL_IB_DISABLE" && !rdma_present) {
      Finding& f = list.add("debug_variables", Severity::kInfo,
                            setting + ": no RDMA device, so nothing is disabled");
      f.subject = name;
      f.evidence = setting + " (environment); " + kRdmaClass + ": no ports";
      continue;
    }
    Finding& f = list.add("debug_variables", Severity::kWarn, setting + " is set");
    f.subject = name;
    f.evidence = setting + " (environment)";
    f.why = variable.why;
    f.fix = "unset " + name;
  }
  if (reported == 0) {
    Finding& f = list.add("debug_variables", Severity::kOk,
                          "no debugging or transport-disabling variable set");
    f.evidence = "environment: none of " + join(names) + " set to a slowing value";
  }
}

}  // namespace

void check_network(const System& system, std::vector<Finding>& out) {
  FindingList list(out, kNetworkArea);
  const std::vector<Interface> interfaces = read_interfaces(system);
  const std::vector<RdmaPort> ports = read_rdma_ports(system);
  const std::map<std::string, std::string> env = system.environment();
  check_interfaces(system, interfaces, list);
  check_rdma(system, ports, list);
  check_socket_ifname(system, env, interfaces, list);
  check_ib_hca(system, env, ports, list);
  check_debug_variables(env, !ports.empty(), list);
}

}  // namespace zerowait::doctor
