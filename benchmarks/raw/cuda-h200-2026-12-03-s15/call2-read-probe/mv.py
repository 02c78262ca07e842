# cuBLAS F16 matvec (torch.mv) bandwidth at the decode shapes, cold (rotating buffers past L2).
import torch
def bench(f, n=40):
    for _ in range(5): f()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e-3
for rows, cols in [(14336, 4096), (4096, 14336), (4096, 4096), (6144, 4096), (28672, 4096), (8192, 2048), (2048, 8192), (128256, 4096)]:
    nb = max(1, min(6, int(300e6 // (rows * cols * 2))))
    Ws = [torch.randn(rows, cols, device='cuda', dtype=torch.float16) for _ in range(nb)]
    x = torch.randn(cols, device='cuda', dtype=torch.float16)
    k = [0]
    def f():
        torch.mv(Ws[k[0] % nb], x); k[0] += 1
    t = bench(f)
    print(f"torch.mv f16 {rows}x{cols}: {t*1e6:.1f} us, {rows*cols*2/t/1e9:.0f} GB/s ({nb} buffers)")
    del Ws
