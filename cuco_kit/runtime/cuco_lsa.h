// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_lsa.h — the one include of a device-initiated candidate: ABI + NCCL device API (real or compat) +
 * runtime helpers.
 *
 * One source, two backends:
 *   - built for `nccl` (default), this pulls in the real <nccl.h> and <nccl_device.h> (NCCL >= 2.28): windows,
 *     ncclDevComm and ncclLsaBarrierSession are NCCL's own, over NVLink.
 *   - built with -DCUCO_BUILD_SYMM=1, it pulls in lsa_compat.h and gin_compat.h instead: the SUBSET of the same
 *     device API (LSA and GIN) the samples use (same names, same semantics), implemented over the harness's
 *     peer-pointer tables and flag region, so 2-4 ranks sharing one GPU run the unchanged kernel.
 * Either way cuco_devcomm.h adds cuco_devcomm_create/destroy (and cuco_devcomm_create_lsa_world), cuco_window,
 * cuco_flags_window and the epoch flag helpers cuco_signal/cuco_wait; cuco_errors.h the CUCO_*_TRY error
 * propagation; cuco_side_stream.h the high-priority side stream that overlapping candidates fork and join;
 * cuco_state.h the setup/step/teardown lifecycle of the state a candidate keeps in ctx->user; cuco_stress.h
 * (through cuco_devcomm.h) the random pauses of the harness's stress build (-DCUCO_STRESS=1); cuco_waits.h the
 * bound on every runtime wait (a flag nobody raises ends in a verdict naming it, not in a killed rank).
 *
 * The flag region (cuco_flags_t in cuco_abi.h): the first CUCO_FLAGS_RESERVED 64-bit words of every rank are
 * owned by the runtime (compat barriers and devComm bookkeeping). A candidate's own flags start at word
 * CUCO_FLAGS_RESERVED; the harness allocates at least CUCO_FLAGS_MIN_WORDS words per rank and zeroes them
 * when a candidate is loaded.
 */
#ifndef CUCO_LSA_H_
#define CUCO_LSA_H_

#include "cuco_abi.h"

/* Words per rank the runtime keeps for itself; candidates index flags from here on. */
#define CUCO_FLAGS_RESERVED 4096
/* Words per rank the harness allocates at least (reserved words included). */
#define CUCO_FLAGS_MIN_WORDS 65536

/* The build switch is CUCO_BUILD_SYMM, not CUCO_BACKEND_SYMM: that name is an enumerator of cuco_abi.h, and a
 * macro of the same name would rewrite it. CUCO_LSA_COMPAT is 0/1 so the preprocessor can test it (enumerators
 * read as 0 in #if). */
#if defined(CUCO_BUILD_SYMM) && CUCO_BUILD_SYMM
#define CUCO_LSA_COMPAT 1
#include "lsa_compat.h"
#include "gin_compat.h" /* GIN puts, signals, counters over the same flag region and peer tables */
#else
#define CUCO_LSA_COMPAT 0
#include <nccl.h>
#include <nccl_device.h>
#endif

#ifdef __cplusplus
/* The backend this object was built for; cuco_setup can refuse a context of the other one. */
static constexpr int cuco_build_backend = CUCO_LSA_COMPAT ? CUCO_BACKEND_SYMM : CUCO_BACKEND_NCCL;
#endif

#include "cuco_devcomm.h"
#include "cuco_side_stream.h"
#include "cuco_state.h"

#endif /* CUCO_LSA_H_ */
