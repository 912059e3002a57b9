#!/usr/bin/env python3
"""Stand-in for a built kernel module: writes OUT.ko, a relocatable x86-64 ELF whose .modinfo section holds
the given key=value strings (what modpost's MODULE_INFO entries become in a real module).

The real kmod tools read exactly this: modinfo prints the fields of .modinfo (libkmod/libkmod-elf.c,
kmod_elf_get_modinfo_strings) and depmod indexes the file and reads .symtab/.strtab for dependencies (empty
here: no exports, no imports). It cannot be loaded (no .gnu.linkonce.this_module, no code): the molecule
hosts never load modules, they only resolve and read them like `modinfo -k RELEASE zfs` does.
usage: zfs-standin-mkko.py OUT.ko key=value...
"""

import struct
import sys

out, fields = sys.argv[1], sys.argv[2:]
modinfo = b"".join(f.encode() + b"\0" for f in fields)
strtab = b"\0"
symtab = b"\0" * 24  # the null symbol (Elf64_Sym)
names = [b"", b".modinfo", b".symtab", b".strtab", b".shstrtab"]
shstrtab = b"\0".join(names) + b"\0"
name_off = [shstrtab.index(n + b"\0") if n else 0 for n in names]

body = [modinfo, symtab, strtab, shstrtab]
offsets, pos = [], 64
for blob in body:
    pos = (pos + 7) & ~7
    offsets.append(pos)
    pos += len(blob)
shoff = (pos + 7) & ~7

ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8  # ELFCLASS64, little endian, SysV
header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 5, 4)


def shdr(name, typ, flags, off, size, link=0, info=0, align=1, entsize=0):
    return struct.pack("<IIQQQQIIQQ", name, typ, flags, 0, off, size, link, info, align, entsize)


sections = [
    shdr(0, 0, 0, 0, 0),
    shdr(name_off[1], 1, 2, offsets[0], len(modinfo)),  # PROGBITS, SHF_ALLOC
    shdr(name_off[2], 2, 0, offsets[1], len(symtab), link=3, info=1, align=8, entsize=24),  # SYMTAB
    shdr(name_off[3], 3, 0, offsets[2], len(strtab)),  # STRTAB
    shdr(name_off[4], 3, 0, offsets[3], len(shstrtab)),
]
data = bytearray(header)
for off, blob in zip(offsets, body, strict=True):
    data += b"\0" * (off - len(data)) + blob
data += b"\0" * (shoff - len(data)) + b"".join(sections)
with open(out, "wb") as f:
    f.write(data)
