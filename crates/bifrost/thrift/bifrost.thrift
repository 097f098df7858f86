// Bifröst's shared types. A GlobalPtr argument is passed by reference: the
// caller's library puts the data in global memory and sends the pointer
// (the Rust generator ignores annotations, so the type is the convention).

struct GlobalPtr {
  1: required i8 node,
  2: required i8 generation,
  3: required i64 offset,
  4: required i64 length,
}
