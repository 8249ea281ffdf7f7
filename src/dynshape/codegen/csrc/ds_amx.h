/* AMX tiles (Intel Sapphire Rapids and later), for the libraries whose products run on them (ds_gemm_bf16.c:
   TDPBF16PS; ds_gemm_int8.c: TDPBUSD). Included by each; its state is each library's own (static), which is harmless:
   Linux's permission is per process, and asking twice is granted twice.

   DS_AMX is 1 where the compiler targets AMX (gcc -march=native on such a CPU) on Linux. Before a thread first
   touches a tile, the process must ask Linux for the tiles' state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA:
   Linux 5.16 and later keep it off until asked); where it is refused the callers keep their AVX-512 path. Every
   tile this project uses is 16 rows x 64 bytes, so one configuration (palette 1, tiles 0..7 whole) serves all; it
   is loaded at each kernel call and released at its end, as another library in the process (a peer runtime, oneDNN)
   may configure the same thread's tiles between two of our calls. Both libraries' tile loops are one pass here
   (ds_amx_pass), the products' instruction its parameter. */
#ifndef DS_AMX_H
#define DS_AMX_H
#include <stdint.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__linux__)
#define DS_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DS_ARCH_REQ_XCOMP_PERM 0x1023
#define DS_XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ds_tilecfg;

static int ds_amx_state = -1; /* -1: not asked yet; 0: refused by the kernel; 1: granted */
static int ds_amx_wanted = 1; /* the library's ds_*_use_amx: the tests run both paths on one machine */

static inline int ds_amx_granted(void) {
    int s = __atomic_load_n(&ds_amx_state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = syscall(SYS_arch_prctl, DS_ARCH_REQ_XCOMP_PERM, DS_XFEATURE_XTILEDATA) == 0;
        __atomic_store_n(&ds_amx_state, s, __ATOMIC_RELEASE);
    }
    return s;
}

/* Whether this library's products take the tiles now: wanted, and granted. */
static inline int ds_amx_on(void) { return __atomic_load_n(&ds_amx_wanted, __ATOMIC_RELAXED) && ds_amx_granted(); }

/* `want` 0 or 1 sets the wish, -1 only asks; returns whether the tiles are used. */
static inline int ds_amx_use(int want) {
    if (want >= 0) __atomic_store_n(&ds_amx_wanted, want != 0, __ATOMIC_RELAXED);
    return ds_amx_on();
}

/* LDTILECFG and STTILECFG over the whole 64-byte configuration: GCC 12's _tile_loadconfig / _tile_storeconfig tell
   the compiler they read / write 8 bytes (`*(void **)p`), so the stores that fill a configuration before the load
   may be dropped as dead (a test's LDTILECFG then took a configuration with no rows and faulted), and the reads
   after a store may be taken from before it. */
static inline void ds_ldtilecfg(const ds_tilecfg *c) { __asm__ volatile("ldtilecfg\t%X0" : : "m"(*c)); }
static inline void ds_sttilecfg(ds_tilecfg *c) { __asm__ volatile("sttilecfg\t%X0" : "=m"(*c)); }
/* Tiles 0..7 as 16 rows x 64 bytes, for this thread, loaded only where its configuration is another (none yet,
   or another library's: read back with STTILECFG, all zeros in the released state). The configuration is kept
   after each call, not released: a LDTILECFG and a TILERELEASE per call cost ~3% of bert_small's bf16 call at
   (8, 128) on one thread (15.0 -> 14.5 ms, Sapphire Rapids-class Xeon), whose products make one call per 64 rows
   and panel of 32 columns (~1,000 cycles of tile products each). Every call zeroes and loads the tiles it uses. */
static inline void ds_amx_load_config(int rows) { /* palette 1, tiles 0..7 of `rows` rows x 64 bytes */
    _Alignas(64) ds_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = (uint8_t)rows; cfg.colsb[t] = 64; }
    ds_ldtilecfg(&cfg);
}
static inline void ds_amx_config(void) {
    _Alignas(64) ds_tilecfg cfg;
    ds_sttilecfg(&cfg);
    int same = cfg.palette == 1;
    for (int t = 0; t < 8 && same; t++) same = cfg.rows[t] == 16 && cfg.colsb[t] == 64;
    if (!same) ds_amx_load_config(16);
}

/* A panel's rows of 128 bytes are two B tiles side by side (columns 0..15, then 16..31). Its `rows` rows past row
   16 * whole (the last, short chunk) copied into `tail` (16 rows x 128 bytes) with zeros after: the rows after a
   panel's end belong to the next panel or to no one. */
static inline void ds_amx_tail(const uint8_t *panel, int64_t whole, int64_t rows, uint8_t *tail) {
    memset(tail, 0, 16 * 128);
    memcpy(tail, panel + whole * 16 * 128, (size_t)(rows - whole * 16) * 128);
}

/* The tile products the passes below take (each compiled where the compiler targets it; the other never runs). */
enum { DS_AMX_BF16, DS_AMX_U8S8 };
#ifdef __AMX_BF16__
#define DS_AMX_DPBF16(c, x, y) _tile_dpbf16ps(c, x, y)
#else
#define DS_AMX_DPBF16(c, x, y) __builtin_trap()
#endif
#ifdef __AMX_INT8__
#define DS_AMX_DPBUSD(c, x, y) _tile_dpbusd(c, x, y)
#else
#define DS_AMX_DPBUSD(c, x, y) __builtin_trap()
#endif
#define DS_AMX_DP(kind, c, x, y)                                                                             \
    do { if ((kind) == DS_AMX_BF16) DS_AMX_DPBF16(c, x, y); else DS_AMX_DPBUSD(c, x, y); } while (0)

/* One chunk of k (16 rows of B, 64 bytes of A a row): `rows` (16 or 32) rows of A from `a` (rows `sa` bytes apart)
   times the two B tiles side by side at `b` (rows of 128 bytes), added into tiles 0, 1 and, for 32 rows, 2, 3;
   `cols` 16: the first B tile only (a panel of at most 16 columns: tiles 1 and 3 untouched); TDPBF16PS or TDPBUSD
   by `kind`. Always inlined: constant `rows`, `cols` and `kind` leave no test in the loop. */
static inline __attribute__((always_inline)) void ds_amx_chunk(const uint8_t *a, int64_t sa, const uint8_t *b,
                                                                const int rows, const int cols, const int kind) {
    _tile_loadd(4, a, sa);
    _tile_loadd(6, b, 128);
    if (cols == 32) _tile_loadd(7, b + 64, 128);
    DS_AMX_DP(kind, 0, 4, 6);
    if (cols == 32) DS_AMX_DP(kind, 1, 4, 7);
    if (rows == 32) {
        _tile_loadd(5, a + 16 * sa, sa);
        DS_AMX_DP(kind, 2, 5, 6);
        if (cols == 32) DS_AMX_DP(kind, 3, 5, 7);
    }
}

/* The sums in tiles 0..3 (`rows` 16 or 32 rows, `cols` 16 or 32 columns: tiles 1 and 3 only for 32 columns, 2
   and 3 only for 32 rows) into `out`, 32 values (128 bytes) a row: a pass's results, read back row by row. */
static inline __attribute__((always_inline)) void ds_amx_store_sums(void *out, const int rows, const int cols) {
    uint8_t *o = (uint8_t *)out;
    _tile_stored(0, o, 128);
    if (cols == 32) _tile_stored(1, o + 64, 128);
    if (rows == 32) {
        _tile_stored(2, o + 16 * 128, 128);
        if (cols == 32) _tile_stored(3, o + 16 * 128 + 64, 128);
    }
}

/* `rows` (16 or 32) rows of A (64 bytes of k a tile row, rows `sa` bytes apart: bf16 pairs or u8 quads) times one
   packed panel (rows of 128 bytes, two B tiles side by side: 16 rows a chunk of k; the last, short chunk from
   `tail`), TDPBF16PS or TDPBUSD by `kind`: the sums in tiles 0, 1 (rows 0..15, columns 0..15 and 16..31) and, for
   32 rows, 2, 3. */
static inline __attribute__((always_inline)) void ds_amx_pass(const uint8_t *a, int64_t sa, const uint8_t *panel,
                                                               const uint8_t *tail, int64_t whole, int64_t chunks,
                                                               const int rows, const int kind) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t kc = 0; kc < chunks; kc++)
        ds_amx_chunk(a + kc * 64, sa, kc < whole ? panel + kc * 16 * 128 : tail, rows, 32, kind);
}
#else
#define DS_AMX 0
static inline int ds_amx_use(int want) { (void)want; return 0; }
#endif
#endif
