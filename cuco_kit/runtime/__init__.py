"""Runtime headers shipped with the package: cuco_abi.h (frozen ABI), cuco_lsa.h (lsa_compat.h under symm) and
the helpers it includes (devComm and epoch flags, bounded waits, error propagation, the side stream), and
symm_nccl/nccl.h (host NCCL under symm, host_nccl_compat.h behind it)."""
