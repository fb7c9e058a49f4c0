# Compares the grouped_gemm kernels' .text sections of /tmp/{base,restr,cand}.cubin (nvcc -cubin -arch=sm_90a of
# src/cuda/sm90/sm90_gemm.cu at three source states): which kernels are byte-identical.
import struct, sys, re, hashlib
def sections(path):
    b = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', b, 0x3A)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', b, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx]
    def name(off):
        s = b[strtab[4] + off:]
        return s[:s.index(b'\0')].decode()
    out = {}
    for h in hdrs:
        n = name(h[0])
        if n.startswith('.text.') and 'grouped' in n:
            out[re.search(r'ILi\d+ELi\d+ELb\dELb\d', n).group(0)] = b[h[4]:h[4] + h[5]]
    return out
a, b, c = (sections(f'/tmp/{x}.cubin') for x in ('base', 'restr', 'cand'))
for k in a:
    print(k, 'base==restr' if a[k] == b[k] else 'base!=restr', 'restr==cand' if b[k] == c[k] else 'restr!=cand', len(a[k]) // 16, len(b[k]) // 16)
