// arc4random for the wheel's binaries, which link libstdc++ statically (CMakeLists.txt).
// GCC 12's libstdc++.a calls glibc's arc4random (std::random_device; linked into every binary,
// since the old-ABI string code references it), and arc4random first came with glibc 2.36. This
// definition satisfies that reference inside each binary, so the wheel keeps needing glibc 2.34
// only (manylinux_2_34: RHEL 9 and its rebuilds, Ubuntu 22.04). Hidden: never exported, it
// replaces nothing for the rest of the process.
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random() {
  uint32_t value = 0;
  for (;;) {
    const ssize_t got = getrandom(&value, sizeof(value), 0);
    if (got == static_cast<ssize_t>(sizeof(value))) return value;
    if (got < 0 && errno != EINTR) {
      // glibc's own arc4random also ends the process when the kernel gives no entropy.
      static const char kMessage[] = "zerowait: getrandom(2) failed; no entropy for arc4random\n";
      (void)!::write(2, kMessage, sizeof(kMessage) - 1);
      _exit(127);
    }
  }
}
