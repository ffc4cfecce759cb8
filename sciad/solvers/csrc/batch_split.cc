// sciad's batch splitter: one XLA FFI handler (CPU) that runs another
// handler on slices of its leading batch axis, on several threads at once.
//
// XLA:CPU runs a custom call on one thread, and a batch of independent
// factorizations in one call (KLU's kernels take a leading batch axis) uses
// one core. `sciad_batch_split` takes the inner handler's arguments plus one
// trailing int64[4] argument `(slot, mask, threads, cleanup)`:
//
// - `slot`: which inner handler (set once with `sciad_batch_set_inner`);
// - `mask`: bit i set where argument i carries the batch axis first (every
//   result does, with the same length);
// - `threads`: how many slices (1 calls the inner handler once);
// - `cleanup`: the slot of a handler called, where a slice failed, on the
//   first result of each slice that did not (`(L,) -> int32 (L,)`: KLU's
//   free of the factors the other slices made), or -1.
//
// Each slice is the inner handler's own call frame: the same API, context,
// stage and attributes, its batched buffers offset and their leading
// dimension shortened. The calling thread runs the first slice, new threads
// the others (the calling thread runs a slice itself where a thread cannot
// start); the call returns when all are done, with the first slice's error
// (in slice order) where any failed. Only synchronous inner handlers (no
// `future`) are supported.
//
// No Python API: loaded with ctypes by `sciad.solvers._batch_split`, which
// registers `sciad_batch_split` as an FFI target.

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace {

using Handler = XLA_FFI_Error* (*)(XLA_FFI_CallFrame*);

constexpr int kSlots = 64;
Handler g_inner[kSlots] = {};

XLA_FFI_Error* make_error(const XLA_FFI_Api* api, const char* message) {
  XLA_FFI_Error_Create_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&args);
}

void destroy_error(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  XLA_FFI_Error_Destroy_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->XLA_FFI_Error_Destroy(&args);
}

size_t dtype_bytes(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
      return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return 0;
  }
}

// One buffer's slice: its own dims array (the leading one shortened).
struct Slice {
  XLA_FFI_Buffer buffer;
  std::vector<int64_t> dims;
};

// The buffers of one slice, and the frame that points to them.
struct SliceFrame {
  std::vector<Slice> args, rets;
  std::vector<void*> arg_ptrs, ret_ptrs;
  XLA_FFI_CallFrame frame;
};

// Fills `out` with buffer `b` sliced to rows [start, start + count) of its
// leading axis of length `total` (the whole buffer where not batched).
bool slice_buffer(const XLA_FFI_Buffer* b, bool batched, int64_t total, int64_t start,
                  int64_t count, Slice* out) {
  out->buffer = *b;
  out->dims.assign(b->dims, b->dims + b->rank);
  if (batched) {
    if (b->rank < 1 || b->dims[0] != total) return false;
    size_t elem = dtype_bytes(b->dtype);
    if (elem == 0) return false;
    int64_t row = 1;
    for (int64_t i = 1; i < b->rank; ++i) row *= b->dims[i];
    out->buffer.data = static_cast<char*>(b->data) + start * row * elem;
    out->dims[0] = count;
  }
  out->buffer.dims = out->dims.data();
  return true;
}

}  // namespace

extern "C" {

// Sets the inner handler of `slot` (0 <= slot < 64); returns 0 on success.
int sciad_batch_set_inner(int slot, void* handler) {
  if (slot < 0 || slot >= kSlots) return 1;
  g_inner[slot] = reinterpret_cast<Handler>(handler);
  return 0;
}

XLA_FFI_Error* sciad_batch_split(XLA_FFI_CallFrame* call) {
  const XLA_FFI_Api* api = call->api;
  if (call->extension_start != nullptr &&
      call->extension_start->type == XLA_FFI_Extension_Metadata) {
    auto* ext = reinterpret_cast<XLA_FFI_Metadata_Extension*>(call->extension_start);
    ext->metadata->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                                     XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    ext->metadata->traits = 0;
    return nullptr;
  }
  if (call->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;

  const int64_t nargs = call->args.size - 1;
  if (nargs < 0 || call->args.types[nargs] != XLA_FFI_ArgType_BUFFER)
    return make_error(api, "sciad_batch_split: no trailing (slot, mask, threads, cleanup) "
                           "argument");
  auto* ctl = static_cast<XLA_FFI_Buffer*>(call->args.args[nargs]);
  if (ctl->dtype != XLA_FFI_DataType_S64 || ctl->rank != 1 || ctl->dims[0] != 4)
    return make_error(api, "sciad_batch_split: the trailing argument is not int64[4]");
  const int64_t* c = static_cast<const int64_t*>(ctl->data);
  const int64_t slot = c[0], mask = c[1], cleanup_slot = c[3];
  int64_t threads = c[2];
  if (slot < 0 || slot >= kSlots || g_inner[slot] == nullptr)
    return make_error(api, "sciad_batch_split: no inner handler in this slot");
  Handler inner = g_inner[slot];
  Handler cleanup = nullptr;
  if (cleanup_slot >= 0) {
    if (cleanup_slot >= kSlots || g_inner[cleanup_slot] == nullptr)
      return make_error(api, "sciad_batch_split: no cleanup handler in this slot");
    cleanup = g_inner[cleanup_slot];
  }
  if (call->rets.size < 1 || call->rets.types[0] != XLA_FFI_RetType_BUFFER)
    return make_error(api, "sciad_batch_split: no result buffer");
  const int64_t total = static_cast<XLA_FFI_Buffer*>(call->rets.rets[0])->dims[0];
  if (threads > total) threads = total;
  if (threads < 1) threads = 1;

  std::vector<SliceFrame> frames(threads);
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t start = total * t / threads, count = total * (t + 1) / threads - start;
    SliceFrame& f = frames[t];
    f.args.resize(nargs);
    f.rets.resize(call->rets.size);
    for (int64_t i = 0; i < nargs; ++i) {
      if (call->args.types[i] != XLA_FFI_ArgType_BUFFER)
        return make_error(api, "sciad_batch_split: an argument is not a buffer");
      if (!slice_buffer(static_cast<XLA_FFI_Buffer*>(call->args.args[i]), (mask >> i) & 1,
                        total, start, count, &f.args[i]))
        return make_error(api, "sciad_batch_split: a batched argument does not lead with "
                               "the batch axis");
    }
    for (int64_t i = 0; i < call->rets.size; ++i) {
      if (call->rets.types[i] != XLA_FFI_RetType_BUFFER ||
          !slice_buffer(static_cast<XLA_FFI_Buffer*>(call->rets.rets[i]), true, total, start,
                        count, &f.rets[i]))
        return make_error(api, "sciad_batch_split: a result does not lead with the batch "
                               "axis");
    }
    for (auto& s : f.args) f.arg_ptrs.push_back(&s.buffer);
    for (auto& s : f.rets) f.ret_ptrs.push_back(&s.buffer);
    f.frame = *call;
    f.frame.extension_start = nullptr;
    f.frame.args.size = nargs;
    f.frame.args.args = f.arg_ptrs.data();
    f.frame.rets.rets = f.ret_ptrs.data();
    f.frame.future = nullptr;
  }

  std::vector<XLA_FFI_Error*> errors(threads, nullptr);
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  int64_t inline_from = threads;  // (slices no thread could take: run here)
  for (int64_t t = 1; t < threads; ++t) {
    try {
      workers.emplace_back([&, t] { errors[t] = inner(&frames[t].frame); });
    } catch (...) {
      inline_from = t;
      break;
    }
  }
  errors[0] = inner(&frames[0].frame);
  for (int64_t t = inline_from; t < threads; ++t) errors[t] = inner(&frames[t].frame);
  for (auto& w : workers) w.join();

  XLA_FFI_Error* first = nullptr;
  for (int64_t t = 0; t < threads; ++t) {
    if (errors[t] == nullptr && frames[t].frame.future != nullptr && first == nullptr)
      first = make_error(api, "sciad_batch_split: the inner handler is asynchronous");
    if (errors[t] == nullptr) continue;
    if (first == nullptr) {
      first = errors[t];
    } else {
      destroy_error(api, errors[t]);
    }
  }
  if (first != nullptr && cleanup != nullptr) {
    for (int64_t t = 0; t < threads; ++t) {
      if (errors[t] != nullptr) continue;  // (a failed slice cleans up after itself)
      Slice& made = frames[t].rets[0];
      // (the cleanup's int32 result: one entry more, so that an empty slice
      // still passes a valid pointer)
      std::vector<int32_t> scratch(made.dims.empty() ? 1 : made.dims[0] + 1);
      int64_t scratch_dims[1] = {made.dims.empty() ? 1 : made.dims[0]};
      XLA_FFI_Buffer out = made.buffer;
      out.dtype = XLA_FFI_DataType_S32;
      out.data = scratch.data();
      out.rank = 1;
      out.dims = scratch_dims;
      void* arg_ptrs[1] = {&made.buffer};
      void* ret_ptrs[1] = {&out};
      XLA_FFI_ArgType arg_types[1] = {XLA_FFI_ArgType_BUFFER};
      XLA_FFI_RetType ret_types[1] = {XLA_FFI_RetType_BUFFER};
      XLA_FFI_CallFrame frame = frames[t].frame;
      frame.args.size = 1;
      frame.args.types = arg_types;
      frame.args.args = arg_ptrs;
      frame.rets.size = 1;
      frame.rets.types = ret_types;
      frame.rets.rets = ret_ptrs;
      if (XLA_FFI_Error* e = cleanup(&frame)) destroy_error(api, e);
    }
  }
  return first;
}

}  // extern "C"
