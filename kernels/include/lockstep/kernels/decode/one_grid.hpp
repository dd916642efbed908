#pragma once
// DecodeOneGrid: the chunk kernel and the merge in one launch, blocks taking tickets.

#include "lockstep/kernels/decode/chunk.hpp"
#include "lockstep/kernels/decode/merge.hpp"

namespace lockstep::kernels {

// Note [one grid]
// DecodeOneGrid<C, M> is the chunk kernel C and the merge M in one launch: its grid is C's
// blocks followed by M's, as one row of blocks. A block's work is not given by its block index
// but by a ticket, an atomic add on p.ticket: tickets below C's block count run that chunk block
// (BlockAt from the ticket, x fastest, as C's own grid), the rest that merge block, which waits
// on its (row, block y) counter as with programmatic launch (Note [block signals]). This cannot
// deadlock whatever order the blocks are scheduled in: a merge block that waits holds a ticket
// above every chunk block's, and every ticket below it was taken by a block that had started and
// so runs on; chunk blocks never wait. The CPU device takes the same tickets (each thread runs
// one block at a time; a merge block that finds its counter short yields until the chunk blocks
// on the other threads have signalled). The arithmetic is C's and M's: the bits are those of the
// two launches (tested); what changes is one launch instead of two, half the host time of an
// eager call.
// The ticket costs each block an atomic round trip before its work. Taken after the wait for
// the prior grid it cost 1% device time at B=1 L=32768 and B=128 L=2048 and 13%
// (2.2 us) on a single-wave call (B=1 L=4096, 32 layers replayed in a graph), so the one grid
// was a knob. Blocks now take it before that wait, where its round trip overlaps the previous
// kernel's tail. This needs p.ticket to be zero, with no store to it still in flight, when the
// grid's first block starts, which may be before the previous kernel has finished (programmatic
// launch: once every block of that kernel has let dependents start or exited):
//   - p.ticket is the first of the stream's counters (launch_decode puts the pairs after it;
//     fused attention's packing tickets and counters start at the second), so only
//     DecodeOneGrid blocks and the fill that zeroes a fresh counter block write it;
//   - the block that takes the last ticket resets it to zero and fences (the reset is performed
//     in the L2) before it lets the next grid start (x.allow_dependent_grids comes after the
//     ticket in every block), and a grid starts only once every block of the kernel before it
//     has passed that point (or exited), so the next call's blocks find it zero. The PTX model
//     gives the trigger no memory ordering (only griddepcontrol.wait does); the argument is the
//     fence's: the reset is in the L2, where the next call's atomics are performed, before the
//     trigger is issued;
//   - the fill that zeroes a fresh block triggers only as its blocks exit, its stores possibly
//     still in flight: the first call after it (Stream::counters says fresh) sets
//     p.ticket_after_wait, and its blocks take the ticket after the wait, as before.
// A ticket counter per (row, block y), 8x less contention, cost more: the cost is the
// round trip. With the Tuning decode.one_grid = 1 the decode plan uses the one grid; it is off by
// default on every device (less host time per eager call, more device time per captured step).
template <class C, class M>
struct DecodeOneGrid {
  static constexpr const char* kName = "decode_one_grid";
  static_assert(C::kThreads == M::kThreads, "a merge block is a chunk block");
  static_assert(C::kStages > 0, "chunk kernels with async tiles (a merge waits on signals)");
  static constexpr int kThreads = C::kThreads;
  static constexpr bool kOverlapsPrior = true;  // Note [overlapped launches]
  static constexpr std::size_t kSharedBytes =
      C::kSharedBytes > M::kSharedBytes ? C::kSharedBytes : M::kSharedBytes;
  static constexpr int kMinBlocks = decode_chunk_blocks_per_sm(C::kQuads * 32, C::kHeads);
  using Params = DecodeParams;
  // Rows of blocks in each part (rows beyond 65535 loop, as in the two launches).
  static constexpr std::int64_t grid_rows(const Params& p) { return p.rows < 65535 ? p.rows : 65535; }
  static constexpr std::int64_t chunk_blocks(const Params& p) {
    return std::int64_t{p.max_chunks} * (p.H / C::kHeads) * grid_rows(p);
  }
  static constexpr std::int64_t merge_blocks(const Params& p) {
    return std::int64_t{p.H} * M::kSlices * grid_rows(p);
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    const std::int64_t nc = chunk_blocks(p);
    const int gz = static_cast<int>(grid_rows(p));
    // The ticket before the wait for the prior grid, so that its round trip overlaps that wait
    // (Note [one grid]: why p.ticket is free here; CudaExec's block_ticket_before_wait fences the
    // last taker's reset), except right after the fill that zeroed a fresh counter block.
    const int total = static_cast<int>(nc + merge_blocks(p));
    int t;
    if (p.ticket_after_wait != 0) {  // block-uniform
      x.wait_prior_grids();
      t = x.block_ticket_before_wait(p.ticket, total);
    } else {
      t = x.block_ticket_before_wait(p.ticket, total);
      x.wait_prior_grids();
    }
    x.allow_dependent_grids();
    if (t < nc) {
      const int gy = p.H / C::kHeads;
      const int cx = t % p.max_chunks;
      const int cyz = t / p.max_chunks;
      // Note [streamed tiles]: the first tiles by a loop that is not unrolled on the GPU.
      C::template chunk_block<!X::kIsCpu>(x, p, BlockAt{cx, cyz % gy, cyz / gy, gy, gz});
    } else {
      const int m = static_cast<int>(t - nc);
      const int mx = p.H * M::kSlices;
      M::merge_block(x, p, m % mx, m / mx, gz, true);
    }
  }
};

}  // namespace lockstep::kernels
