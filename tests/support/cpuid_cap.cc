// libkiln_cpuid_cap.so: makes a whole process — and every program it starts — see a smaller x86-64
// CPU than the one it runs on, so that a peer Kiln is measured against (PyTorch with OpenBLAS and
// its bundled oneDNN, ONNX Runtime's MLAS, anything that picks kernels from CPUID) runs the code it
// would run on that CPU. Kiln caps itself with KILN_CPU_ISA (base/cpu_isa.h); peers have no such
// switch, and comparing Kiln at AVX2 with a peer at AVX-512 would measure the wrong machine.
//
//   KILN_CPUID_CAP=avx2 LD_PRELOAD=build/tests/libkiln_cpuid_cap.so python3 peer.py
//
// Levels are Kiln's names: sse41 (x86-64-v2), avx2 (x86-64-v3), avx512 (x86-64-v4 without VNNI),
// avx512_vnni, avx512_bf16; "" or unset does nothing. How: Linux's CPUID faulting
// (arch_prctl(ARCH_SET_CPUID, 0), CPUs with the `cpuid_fault` flag, Intel since Ivy Bridge and
// AMD since Zen 4 or so, also under KVM) turns every CPUID instruction of the process into a
// SIGSEGV; the handler runs the real CPUID with faulting briefly off, clears the feature bits above
// the level and steps over the instruction. Faulting is inherited by threads and reset by execve,
// so LD_PRELOAD (inherited through the environment) sets it again in each program. Code that uses
// an instruction without asking CPUID first still runs it: this caps dispatch, not the silicon.
//
// Where the CPU cannot fault CPUID, or the level is no name above, the process exits 3 with a line
// on stderr: a peer that silently ran at the full level would report the wrong ratio. A SIGSEGV
// that is not a CPUID goes to the handler the program installed (or kills the process as usual):
// the library interposes sigaction() and signal() for SIGSEGV, so a program that resets every
// handler at startup (node does) or installs its own (V8's WebAssembly trap handler) keeps
// CPUID emulation underneath, and sees its own handler as the installed one.
// The bench harness (bench/cpu_isa_env.h) preloads it for every peer when KILN_CPU_ISA is set;
// the CTest cpuid_cap_test checks that Kiln itself reads the capped level through it.
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// Feature bits a level does not have, by (leaf, subleaf, register). Bits are cleared cumulatively:
// a level also loses everything the levels above it lose.
struct Masks {
  uint32_t leaf1_ecx = 0;
  uint32_t leaf7_ebx = 0, leaf7_ecx = 0, leaf7_edx = 0;
  uint32_t leaf7_1_eax = 0;
  uint32_t ext1_ecx = 0;  // leaf 0x80000001
};

constexpr uint32_t Bit(int b) { return uint32_t{1} << b; }

// Above avx512_bf16: AMX (tile, int8, bf16; leaf 7 EDX 24, 25, 22), AVX512-FP16 (EDX 23) and the
// newer leaf 7.1 EAX features (AVX-VNNI 4 is a v3-class extra; 21 AMX-FP16, 23 AVX-IFMA).
void MaskAboveBf16(Masks& m) {
  m.leaf7_edx |= Bit(22) | Bit(23) | Bit(24) | Bit(25);
  m.leaf7_1_eax |= Bit(4) | Bit(21) | Bit(23);
}
void MaskAboveVnni(Masks& m) {
  MaskAboveBf16(m);
  m.leaf7_1_eax |= Bit(5);  // AVX512_BF16
}
void MaskAboveAvx512(Masks& m) {
  MaskAboveVnni(m);
  m.leaf7_ecx |= Bit(11);  // AVX512_VNNI
}
// x86-64-v3: no AVX-512 of any kind (F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31;
// VBMI 1, VBMI2 6, BITALG 12, VPOPCNTDQ 14; 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8).
void MaskAboveAvx2(Masks& m) {
  MaskAboveAvx512(m);
  m.leaf7_ebx |= Bit(16) | Bit(17) | Bit(21) | Bit(26) | Bit(27) | Bit(28) | Bit(30) | Bit(31);
  m.leaf7_ecx |= Bit(1) | Bit(6) | Bit(12) | Bit(14);
  m.leaf7_edx |= Bit(2) | Bit(3) | Bit(8);
}
// x86-64-v2: no AVX, AVX2, FMA, F16C, MOVBE (leaf 1 ECX 28, 12, 29, 22), BMI1/2 (leaf 7 EBX 3, 8),
// AVX2 (EBX 5), VEX-encoded VAES/VPCLMULQDQ (ECX 9, 10), LZCNT (0x80000001 ECX 5).
void MaskAboveSse41(Masks& m) {
  MaskAboveAvx2(m);
  m.leaf1_ecx |= Bit(12) | Bit(22) | Bit(28) | Bit(29);
  m.leaf7_ebx |= Bit(3) | Bit(5) | Bit(8);
  m.leaf7_ecx |= Bit(9) | Bit(10);
  m.ext1_ecx |= Bit(5);
}

Masks g_masks;
bool g_active = false;        // the handler is installed
struct sigaction g_previous;  // the program's own SIGSEGV action, as it believes installed

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
SigactionFn RealSigaction() {
  static SigactionFn real = reinterpret_cast<SigactionFn>(dlsym(RTLD_NEXT, "sigaction"));
  return real;
}

long SetCpuidFaulting(bool on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1); }

void Emulate(greg_t* r) {
  const uint32_t leaf = static_cast<uint32_t>(r[REG_RAX]);
  const uint32_t sub = static_cast<uint32_t>(r[REG_RCX]);
  uint32_t a, b, c, d;
  SetCpuidFaulting(false);
  __cpuid_count(leaf, sub, a, b, c, d);
  SetCpuidFaulting(true);
  if (leaf == 1) c &= ~g_masks.leaf1_ecx;
  if (leaf == 7 && sub == 0) {
    b &= ~g_masks.leaf7_ebx;
    c &= ~g_masks.leaf7_ecx;
    d &= ~g_masks.leaf7_edx;
  }
  if (leaf == 7 && sub == 1) a &= ~g_masks.leaf7_1_eax;
  if (leaf == 0x80000001u) c &= ~g_masks.ext1_ecx;
  // CPUID writes the low 32 bits and zeroes the upper half of each register.
  r[REG_RAX] = a;
  r[REG_RBX] = b;
  r[REG_RCX] = c;
  r[REG_RDX] = d;
  r[REG_RIP] += 2;
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  greg_t* r = uc->uc_mcontext.gregs;
  const auto* ip = reinterpret_cast<const unsigned char*>(r[REG_RIP]);
  if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) return Emulate(r);
  if (g_previous.sa_flags & SA_SIGINFO) return g_previous.sa_sigaction(sig, info, context);
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN)
    return g_previous.sa_handler(sig);
  // Not ours and nobody else's: restore the default so the instruction faults again and kills us.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  RealSigaction()(SIGSEGV, &dfl, nullptr);
}

[[noreturn]] void Fail(const char* why, const char* level) {
  std::fprintf(stderr, "libkiln_cpuid_cap: KILN_CPUID_CAP=%s: %s\n", level, why);
  _exit(3);
}

__attribute__((constructor)) void Install() {
  const char* level = std::getenv("KILN_CPUID_CAP");
  if (level == nullptr || *level == '\0') return;
  if (!std::strcmp(level, "sse41"))
    MaskAboveSse41(g_masks);
  else if (!std::strcmp(level, "avx2"))
    MaskAboveAvx2(g_masks);
  else if (!std::strcmp(level, "avx512"))
    MaskAboveAvx512(g_masks);
  else if (!std::strcmp(level, "avx512_vnni"))
    MaskAboveVnni(g_masks);
  else if (!std::strcmp(level, "avx512_bf16"))
    MaskAboveBf16(g_masks);
  else
    Fail("not a level (sse41, avx2, avx512, avx512_vnni, avx512_bf16)", level);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSegv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (RealSigaction() == nullptr || RealSigaction()(SIGSEGV, &sa, &g_previous) != 0)
    Fail("cannot install the SIGSEGV handler", level);
  g_active = true;
  if (SetCpuidFaulting(true) != 0)
    Fail("this CPU or kernel cannot fault CPUID (no cpuid_fault flag in /proc/cpuinfo)", level);
}

}  // namespace

// The program's view of SIGSEGV: what it installs becomes the handler CPUID emulation chains to.
extern "C" int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV || !g_active) return RealSigaction()(sig, act, old);
  if (old != nullptr) *old = g_previous;
  if (act != nullptr) g_previous = *act;
  return 0;
}

extern "C" sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  std::memset(&act, 0, sizeof(act));
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;  // glibc's signal(): BSD semantics
  sigemptyset(&act.sa_mask);
  sigaddset(&act.sa_mask, sig);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}
