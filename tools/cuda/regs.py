#!/usr/bin/env python3
"""Registers and local-memory (stack) bytes of every kernel in kernels.cu,
compiled here by NVRTC to an sm_90 cubin (no GPU, no ptxas needed):
`python3 tools/cuda/regs.py [FILTER]`. Needs libnvrtc.so.13 (PyPI's
nvidia-cuda-nvrtc, on LD_LIBRARY_PATH or in site-packages). The source is
what NVRTC gets at run time (kernels.cu after the IQ tables compile.rs
prints from ferrox-quant): read from $FERROX_KERNEL_SRC if set, else
printed by `cargo run --release -p ferrox-cuda --example kernel_source`.
FERROX_CUDA_DEFINES (as at run time) sets the kernels' compile-time knobs."""
import ctypes, glob, os, struct, subprocess, sys

def load_nvrtc():
    cands = ["libnvrtc.so.13"]
    try:
        import nvidia
        for p in nvidia.__path__:
            cands += glob.glob(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))
    except ImportError:
        pass
    for c in cands:
        try:
            return ctypes.CDLL(c)
        except OSError:
            pass
    sys.exit("libnvrtc.so.13 not found")

def cubin(src):
    nv = load_nvrtc()
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernels.cu", 0, None, None) == 0
    # FERROX_CUDA_DEFINES: the kernels' compile-time knobs, as the host passes them.
    opts = [b"--gpu-architecture=sm_90"] + [b"-D" + d.encode() for d in os.environ.get("FERROX_CUDA_DEFINES", "").split()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(log.value.decode())
    nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    assert nv.nvrtcGetCUBIN(prog, buf) == 0
    return buf.raw

def sections(elf):
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    name = lambda o: elf[stro + o: elf.index(b"\0", stro + o)].decode()
    return [(name(h[0]), h) for h in hdrs]

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("FERROX_KERNEL_SRC"):
        src = open(os.environ["FERROX_KERNEL_SRC"]).read()
    else:
        src = subprocess.run(
            ["cargo", "run", "-q", "--release", "-p", "ferrox-cuda", "--example", "kernel_source"],
            cwd=os.path.join(here, "..", ".."), check=True, capture_output=True, text=True).stdout
    elf = cubin(src)
    if os.environ.get("CUBIN"):
        open(os.environ["CUBIN"], "wb").write(elf)
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    secs = sections(elf)
    # The global .nv.info holds (symbol, value) attributes: 0x2f register
    # count, 0x11 frame (local stack) bytes; each .nv.info.<kernel>'s
    # sh_info is its kernel's symbol index.
    regs, frames = {}, {}
    for nm, h in secs:
        if nm == ".nv.info":
            d = elf[h[4]:h[4] + h[5]]
            i = 0
            while i + 4 <= len(d):
                fmt, attr = d[i], d[i + 1]
                if fmt == 4:
                    size = struct.unpack_from("<H", d, i + 2)[0]
                    if size == 8:
                        sym, val = struct.unpack_from("<II", d, i + 4)
                        {0x2F: regs, 0x11: frames}.get(attr, {})[sym] = val
                    i += 4 + size
                else:
                    i += 2 if fmt == 1 else 4
    # Symbol indices by name, from .symtab (24-byte Elf64_Sym entries).
    symtab = next(h for nm, h in secs if nm == ".symtab")
    strtab = secs[symtab[6]][1]
    index = {}
    for i in range(symtab[5] // 24):
        st_name, = struct.unpack_from("<I", elf, symtab[4] + 24 * i)
        o = strtab[4] + st_name
        index[elf[o:elf.index(b"\0", o)].decode()] = i
    for nm, h in secs:
        if nm.startswith(".text.") and filt in nm:
            k = nm[len(".text."):]
            sym = index.get(k, -1)
            print(f"{k:32s} regs {regs.get(sym, -1):4d}  stack {frames.get(sym, 0):4d}")

main()
