// Bifröst's shared types. A GlobalPtr argument is passed by reference: the
// caller's library puts the data in global memory and sends the pointer
// (the Rust generator ignores annotations, so the type is the convention).
// A call's pointer arguments share one allocation, which its RPC header
// names, so the Gatekeeper lends the callee all of them at once: `offset`
// is that allocation's start and `at` where this argument begins inside
// it. A pointer a method returns is an allocation of the callee's, whose
// control passes to the caller with the reply.

struct GlobalPtr {
  1: required i8 node,
  2: required i8 generation,
  3: required i64 offset,
  4: required i64 length,
  5: required i64 at,
}
