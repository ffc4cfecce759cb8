// A zero-filled array whose pages are not touched until written: the
// record of a loop's accepted steps (`max_steps + 1` rows, a few hundred of
// them written) costs the rows written, not a memset of every row.
//
// The handler memsets the partial pages at the buffer's ends and hands the
// whole pages between them back to the kernel with madvise(MADV_DONTNEED):
// on Linux, a private anonymous page dropped so reads as zeros when next
// touched (a fresh zero page, faulted in on first access). XLA's CPU
// buffers are malloc'd (private anonymous memory), so the result is the
// zeros it promises. Elsewhere (no MADV_DONTNEED with that meaning), or
// where madvise refuses, or for a buffer of a few pages, it is a memset.
// Called from Python through XLA's FFI (sciad.solvers._zeros).

#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

void Zero(char* p, size_t size) {
#if defined(__linux__)
  const long ps = sysconf(_SC_PAGESIZE);
  const uintptr_t page = ps > 0 ? static_cast<uintptr_t>(ps) : 0;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), e = a + size;
  const uintptr_t lo = page ? (a + page - 1) & ~(page - 1) : a;
  const uintptr_t hi = page ? e & ~(page - 1) : a;
  if (page && (page & (page - 1)) == 0 && hi > lo + 16 * page) {
    std::memset(p, 0, lo - a);
    std::memset(reinterpret_cast<char*>(hi), 0, e - hi);
    if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0)
      std::memset(reinterpret_cast<char*>(lo), 0, hi - lo);
    return;
  }
#endif
  std::memset(p, 0, size);
}

ffi::Error ZerosImpl(ffi::Result<ffi::AnyBuffer> out) {
  Zero(static_cast<char*>(out->untyped_data()), out->size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_zeros, ZerosImpl, ffi::Ffi::Bind().Ret<ffi::AnyBuffer>());
