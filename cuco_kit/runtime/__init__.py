"""Runtime headers shipped with the package: cuco_abi.h (frozen ABI), lsa_compat.h, devcomm helpers."""
