#!/usr/bin/env python3
"""Writes a copy of kernels/cuda/fused_mlp.cuh whose step kernel reads clocks at its phase boundaries.

Every block's thread 0 reads clock64() at 11 marks and adds the cycles since its last mark into
fused_phase_cycles[block][mark]; block 0 also records its start and end (%globaltimer, ns) per step in
fused_step_ns[step]. The marks are placed by anchors in the kernel's text (the lines that end each phase), so that
the same script times the kernel of any commit since 2026-11-27; it stops with an error naming the anchor it did not
find. fused_mlp_phases.cu reads the counters.

  make_timed.py SOURCE_HEADER OUTPUT_HEADER
"""
import sys


def insert_after(text, anchor, insertion, start):
    at = text.index(anchor, start) + len(anchor)
    return text[:at] + insertion + text[at:], at


def insert_before(text, anchor, insertion, start):
    at = text.index(anchor, start)
    return text[:at] + insertion + text[at:], at + len(insertion)


def main(source, output):
    s = open(source).read()
    counters = '''
__device__ unsigned long long fused_phase_cycles[256][11];
__device__ unsigned long long fused_step_ns[8192][2];
__device__ inline unsigned long long fused_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define FUSED_MARK(n)                                                                     \\
  do {                                                                                    \\
    if (threadIdx.x == 0) {                                                               \\
      const long long now = clock64();                                                    \\
      fused_phase_cycles[blockIdx.x][n] += (unsigned long long)(now - mark_last);         \\
      mark_last = now;                                                                    \\
    }                                                                                     \\
  } while (0)
'''
    s = s.replace('namespace kiln::kernels::cuda {\n', 'namespace kiln::kernels::cuda {\n' + counters, 1)
    kernel = s.index('fused_mlp_step_kernel(fused_mlp_step_arguments g) {')
    body = s.index('\n', kernel) + 1
    clocks = '  long long mark_last = clock64();\n  const unsigned long long start_ns = fused_globaltimer();\n'
    s = s[:body] + clocks + s[body:]
    # 0: the start (step count, Adam's constants)
    line_end = s.index('\n', s.index('const fused_adam adam(g.adam,', kernel)) + 1
    s = s[:line_end] + '  FUSED_MARK(0);\n' + s[line_end:]
    pos = line_end
    # 1: W1's rows in shared memory (the barrier after them)
    rows = s.index('w1_rows[i] =', pos) if 'w1_rows[i] =' in s[pos:] else s.index('w1_rows[u * g.in + f] =', pos)
    s, pos = insert_after(s, '  __syncthreads();\n', '  FUSED_MARK(1);\n', rows)
    # 2: the forward; 3: the first grid barrier
    s, pos = insert_before(s, '  cg::this_grid().sync();\n', '  FUSED_MARK(2);\n', pos)
    s, pos = insert_after(s, '  cg::this_grid().sync();\n', '  FUSED_MARK(3);\n', pos)
    # 9 and 10 (warp 0, summed over its groups of samples): the head's class sums, then the per-sample epilogue
    sums_end = s.find('    // As in the forward, every sample of the group is reduced', pos)
    if sums_end >= 0:
        s = s[:sums_end] + '    FUSED_MARK(9);\n' + s[sums_end:]
        store = s.index('dlogits[s * g.out + lane] = valid && lane == label ? p - factor : p;\n', sums_end)
        s, _ = insert_after(s, '      }\n    }\n', '    FUSED_MARK(10);\n', store)
    # 4: the rest of the head (the loss's block reduction)
    s, pos = insert_after(s, '*g.loss = static_cast<float>(block_loss) * g.loss_scale;\n', '  FUSED_MARK(4);\n', pos)
    # 5: dL/dhidden and dW2's columns; 6: b1, dW1 and Adam on W1; 7: the second grid barrier
    s, pos = insert_after(s, '  __syncthreads();\n', '  FUSED_MARK(5);\n', pos)
    s, pos = insert_before(s, '  cg::this_grid().sync();\n', '  FUSED_MARK(6);\n', pos)
    s, pos = insert_after(s, '  cg::this_grid().sync();\n', '  FUSED_MARK(7);\n', pos)
    # 8: Adam on W2 and b2, to the kernel's end
    kernel_ends = ('    if (thread == 0) *g.step = step;\n  }\n',
                   '      g.bias_corrections[1] = next.second;\n    }\n  }\n')
    for end in kernel_ends:
        if s.find(end, pos) >= 0:
            break
    s, pos = insert_after(s, end, '''  FUSED_MARK(8);
  if (blockIdx.x == 0 && thread == 0 && step < 8192) {
    fused_step_ns[step][0] = start_ns;
    fused_step_ns[step][1] = fused_globaltimer();
  }
''', pos)
    open(output, 'w').write(s)


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
