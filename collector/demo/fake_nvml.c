/*
 * A fake libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * The unmodified pynvml (nvidia-ml-py) loads it with ctypes when it is first on
 * LD_LIBRARY_PATH. It plays a scenario file named by $FAKE_NVML_SCENARIO; scenario time is
 * wall-clock seconds since the file's `start` epoch, so a restarted agent sees one timeline.
 * Functions not defined here raise NVMLError_FunctionNotFound in pynvml (e.g. GPM), and an
 * `unsupported` line makes a defined one return NVML_ERROR_NOT_SUPPORTED: both must turn into
 * NULL fields, never a crash. Semantics follow NVML's documentation: units (mW, mJ, KB/s,
 * bytes), two-call size protocols, NOT_FOUND when no process samples, TIMEOUT from event waits.
 *
 * Scenario lines (whitespace separated, `#` comments):
 *   start EPOCH                     scenario time 0 (float seconds since 1970)
 *   driver VERSION | cuda INT       e.g. 550.54.15 | 12040
 *   gpu IDX UUID BUSID MINOR NUMA   a GPU (NVML index order)
 *   name IDX rest of line           product name
 *   cpus IDX HEXMASK                CPU affinity bitmask (first 64 CPUs)
 *   set T IDX KEY VALUE [KEY VALUE ...]   from time T on, KEY = VALUE
 *   proc T IDX PID MEM_MIB SM MEM   from T on, PID runs on GPU IDX (SM/MEM: its utilization %)
 *   procend T IDX PID               from T on, PID no longer runs there
 *   procfile T IDX PATH MEM_MIB SM MEM   as proc, for the PID written in file PATH once it is there
 *                                   (a process started after the scenario, e.g. a Slurm job's;
 *                                   the driver knows what runs where, a test tells the fake so)
 *   xid T IDX CODE                  an XID event at T
 *   lost T IDX                      from T on, every call on IDX returns GPU_IS_LOST
 *   unsupported FUNCTION [IDX]      FUNCTION returns NOT_SUPPORTED (on IDX, or on all GPUs); FUNCTION
 *                                   `fi.ID`: that one field value is NOT_SUPPORTED inside the batch
 *                                   (its own nvmlReturn), the others in the same call still answer
 *   link IDX1 IDX2 LEVEL            topology common ancestor (0,10,20,30,40,50)
 *   nvlink IDX LINK PEER_IDX        an active NVLink from IDX to PEER_IDX
 *   mig IDX MODE                    MIG mode (0/1)
 *   migdev ID IDX SLOT UUID GI CI PROFILE   a MIG instance (compute instance CI of GPU instance GI)
 *                                   of GPU IDX in MIG mode, at MIG device index SLOT (0-6), e.g.
 *                                   `migdev 100 0 0 MIG-... 7 0 1g.10gb`; ID (not a GPU index) names it
 *                                   in set/proc/procend/xid lines (its own memory, GPM keys, processes)
 * KEYS: sm mem enc dec jpg ofa power_mw power_limit_mw temp memtemp smclk memclk smclk_max
 *   memclk_max fb_total_mib fb_used_mib pcie_rx_kbs pcie_tx_kbs pcie_gen pcie_width
 *   pcie_gen_max pcie_width_max replay nvl_rx_kbs nvl_tx_kbs clkev ecc_sbe ecc_dbe
 *   remap_corr remap_unc remap_pending remap_fail ecc_mode persistence power_default_mw gpm_sm gpm_occ gpm_tensor gpm_dram gpm_fp16 gpm_fp32
 *   gpm_fp64 gpm_gr (a GPU with any gpm_ key supports GPM; metrics are time averages between two samples)
 *   fb_reserved_mib (framebuffer the driver reserves: nvmlDeviceGetMemoryInfo_v2 only; 0 when unset)
 *   fi.ID: any other NVML field value by its numeric field id (e.g. fi.45, NVLink CRC data errors)
 * Field values NVML also gives through a call come from that call's key (FIELD_KEYS below): power
 * (NVML_FI_DEV_POWER_AVERAGE and _INSTANT, mW), energy (mJ), ECC volatile totals, PCIe replays,
 * remapped rows, memory temperature; NVLink data throughput (KiB counters) from nvl_rx/tx_kbs.
 * Energy and NVLink byte counters are integrals of power and throughput over scenario time.
 *
 * MIG, as NVML documents it: a MIG device handle answers only the calls in MIG_CALLS (identity,
 * memory, processes); every other call returns NOT_SUPPORTED there, since power, clocks,
 * temperature, PCIe, NVLink, ECC and events exist only on the parent. A parent in MIG mode answers
 * NOT_SUPPORTED for utilization rates and per-process utilization; its running processes are the
 * aggregate of its instances (with their GPU/compute instance ids); GPM of an instance comes from
 * nvmlGpmMigSampleGet(parent, GI); an XID of an instance arrives on the parent with its GI/CI ids.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum { OK = 0, UNINIT = 1, INVALID = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT = 7, TIMEOUT = 10,
       GPU_LOST = 15, UNKNOWN = 999 };

#define MAX_GPUS 16
#define MAX_SETS 262144 /* a second-by-second timeline of 8 GPUs' metrics for half an hour */
#define MAX_PROCS 1024
#define MAX_XIDS 256
#define MAX_UNSUP 64
#define MAX_LINKS 18
#define MAX_MIGS 64
#define MAX_MIG_DEVICES 7 /* nvmlDeviceGetMaxMigDeviceCount on A100/H100 */
#define NO_INSTANCE 0xFFFFFFFFu

enum { K_SM, K_MEM, K_ENC, K_DEC, K_JPG, K_OFA, K_POWER, K_POWER_LIMIT, K_TEMP, K_MEMTEMP, K_SMCLK, K_MEMCLK,
       K_SMCLK_MAX, K_MEMCLK_MAX, K_FB_TOTAL, K_FB_USED, K_PCIE_RX, K_PCIE_TX, K_PCIE_GEN, K_PCIE_WIDTH,
       K_PCIE_GEN_MAX, K_PCIE_WIDTH_MAX, K_REPLAY, K_NVL_RX, K_NVL_TX, K_CLKEV, K_ECC_SBE, K_ECC_DBE,
       K_REMAP_CORR, K_REMAP_UNC, K_REMAP_PENDING, K_REMAP_FAIL, K_ECC_MODE, K_PERSISTENCE, K_POWER_DEFAULT, K_GPM_SM, K_GPM_OCC, K_GPM_TENSOR, K_GPM_DRAM,
       K_GPM_FP16, K_GPM_FP32, K_GPM_FP64, K_GPM_GR, K_FB_RESERVED, K_COUNT };
static const char *KEYS[K_COUNT] = {
    "sm", "mem", "enc", "dec", "jpg", "ofa", "power_mw", "power_limit_mw", "temp", "memtemp", "smclk", "memclk",
    "smclk_max", "memclk_max", "fb_total_mib", "fb_used_mib", "pcie_rx_kbs", "pcie_tx_kbs", "pcie_gen",
    "pcie_width", "pcie_gen_max", "pcie_width_max", "replay", "nvl_rx_kbs", "nvl_tx_kbs", "clkev", "ecc_sbe",
    "ecc_dbe", "remap_corr", "remap_unc", "remap_pending", "remap_fail", "ecc_mode", "persistence",
    "power_default_mw", "gpm_sm", "gpm_occ", "gpm_tensor",
    "gpm_dram", "gpm_fp16", "gpm_fp32", "gpm_fp64", "gpm_gr", "fb_reserved_mib"};

typedef struct gpu {
    int index;
    char uuid[96], busid[32], name[96];
    unsigned minor;
    int numa;
    unsigned long long cpumask;
    double lost_at;
    int mig;
    int nvlink_peer[MAX_LINKS];
    struct gpu *parent; /* a MIG instance: its GPU; NULL for a GPU */
    unsigned gi, ci;
    int slot;
    char profile[32];
} gpu_t;

typedef struct { double t; int gpu, key; double value; int line; } set_t; /* line: file order */
/* `fi.ID VALUE`: any other NVML field value (a counter such as NVLink errors), by NVML field id. */
#define FIELD_KEY(id) (1000 + (int)(id))
typedef struct { double t; int gpu; unsigned pid; int end; double mem_mib, sm, mem; char pidfile[256]; } proc_t;
typedef struct { double t; int gpu; unsigned long long code; int delivered; } xid_t;
typedef struct { char fn[64]; int gpu; } unsup_t;

static gpu_t gpus[MAX_GPUS];
static int ngpus;
static gpu_t migs[MAX_MIGS];
static int nmigs;
static set_t sets[MAX_SETS];
static int nsets;
static proc_t procs[MAX_PROCS];
static int nprocs;
static xid_t xids[MAX_XIDS];
static int nxids;
static unsup_t unsup[MAX_UNSUP];
static int nunsup;
static int levels[MAX_GPUS][MAX_GPUS];
static double start_epoch;
static char driver[32] = "550.54.15";
static int cuda = 12040;
static int initialized;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9 - start_epoch;
}

/* Sets ordered by GPU, key, time and file order: a reading finds its series by bisection, so a
 * call costs the same whatever the scenario's size (the agent's CPU benchmark counts the
 * library's time as the agent's). */
static int by_series(const void *a, const void *b) {
    const set_t *x = a, *y = b;
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->line - y->line;
}

/* The first set of GPU's KEY series (nsets when it has none). */
static int series(int gpu, int key) {
    int lo = 0, hi = nsets;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (sets[mid].gpu < gpu || (sets[mid].gpu == gpu && sets[mid].key < key)) lo = mid + 1;
        else hi = mid;
    }
    return lo < nsets && sets[lo].gpu == gpu && sets[lo].key == key ? lo : nsets;
}

static int load(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    char line[1024];
    ngpus = nmigs = nsets = nprocs = nxids = nunsup = 0;
    for (int i = 0; i < MAX_GPUS; i++)
        for (int j = 0; j < MAX_GPUS; j++) levels[i][j] = (i == j) ? 0 : 50;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char word[64];
        int n = 0;
        if (sscanf(line, "%63s%n", word, &n) != 1) continue;
        char *rest = line + n;
        if (!strcmp(word, "start")) sscanf(rest, "%lf", &start_epoch);
        else if (!strcmp(word, "driver")) sscanf(rest, "%31s", driver);
        else if (!strcmp(word, "cuda")) sscanf(rest, "%d", &cuda);
        else if (!strcmp(word, "gpu") && ngpus < MAX_GPUS) {
            gpu_t *g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            if (sscanf(rest, "%d %95s %31s %u %d", &g->index, g->uuid, g->busid, &g->minor, &g->numa) == 5) {
                g->lost_at = INFINITY;
                for (int l = 0; l < MAX_LINKS; l++) g->nvlink_peer[l] = -1;
                strcpy(g->name, "NVIDIA Fake GPU");
                ngpus++;
            }
        } else if (!strcmp(word, "name")) {
            int idx, m = 0;
            if (sscanf(rest, "%d %n", &idx, &m) >= 1 && idx < ngpus) {
                snprintf(gpus[idx].name, sizeof gpus[idx].name, "%s", rest + m);
                gpus[idx].name[strcspn(gpus[idx].name, "\r\n")] = 0;
            }
        } else if (!strcmp(word, "cpus")) {
            int idx;
            unsigned long long mask;
            if (sscanf(rest, "%d %llx", &idx, &mask) == 2 && idx < ngpus) gpus[idx].cpumask = mask;
        } else if (!strcmp(word, "set")) {
            double t;
            int idx, m = 0;
            if (sscanf(rest, "%lf %d%n", &t, &idx, &m) < 2) continue;
            char *p = rest + m;
            char key[64];
            double v;
            int k;
            while (sscanf(p, "%63s %lf%n", key, &v, &k) == 2 && nsets < MAX_SETS) {
                p += k;
                unsigned fid;
                if (sscanf(key, "fi.%u", &fid) == 1) sets[nsets] = (set_t){t, idx, FIELD_KEY(fid), v, nsets}, nsets++;
                for (int i = 0; i < K_COUNT; i++)
                    if (!strcmp(key, KEYS[i])) sets[nsets] = (set_t){t, idx, i, v, nsets}, nsets++;
            }
        } else if (!strcmp(word, "proc") && nprocs < MAX_PROCS) {
            proc_t *p = &procs[nprocs];
            if (sscanf(rest, "%lf %d %u %lf %lf %lf", &p->t, &p->gpu, &p->pid, &p->mem_mib, &p->sm, &p->mem) == 6) {
                p->end = 0;
                p->pidfile[0] = 0;
                nprocs++;
            }
        } else if (!strcmp(word, "procfile") && nprocs < MAX_PROCS) {
            proc_t *p = &procs[nprocs];
            memset(p, 0, sizeof *p);
            if (sscanf(rest, "%lf %d %255s %lf %lf %lf", &p->t, &p->gpu, p->pidfile, &p->mem_mib, &p->sm, &p->mem) == 6)
                nprocs++;
        } else if (!strcmp(word, "procend") && nprocs < MAX_PROCS) {
            proc_t *p = &procs[nprocs];
            if (sscanf(rest, "%lf %d %u", &p->t, &p->gpu, &p->pid) == 3) {
                p->end = 1;
                p->pidfile[0] = 0;
                nprocs++;
            }
        } else if (!strcmp(word, "xid") && nxids < MAX_XIDS) {
            xid_t *x = &xids[nxids];
            if (sscanf(rest, "%lf %d %llu", &x->t, &x->gpu, &x->code) == 3) {
                x->delivered = 0;
                nxids++;
            }
        } else if (!strcmp(word, "lost")) {
            double t;
            int idx;
            if (sscanf(rest, "%lf %d", &t, &idx) == 2 && idx < ngpus) gpus[idx].lost_at = t;
        } else if (!strcmp(word, "unsupported") && nunsup < MAX_UNSUP) {
            unsup[nunsup].gpu = -1;
            if (sscanf(rest, "%63s %d", unsup[nunsup].fn, &unsup[nunsup].gpu) >= 1) nunsup++;
        } else if (!strcmp(word, "link")) {
            int a, b, level;
            if (sscanf(rest, "%d %d %d", &a, &b, &level) == 3 && a < MAX_GPUS && b < MAX_GPUS)
                levels[a][b] = levels[b][a] = level;
        } else if (!strcmp(word, "nvlink")) {
            int a, link, peer;
            if (sscanf(rest, "%d %d %d", &a, &link, &peer) == 3 && a < ngpus && link < MAX_LINKS)
                gpus[a].nvlink_peer[link] = peer;
        } else if (!strcmp(word, "mig")) {
            int idx, mode;
            if (sscanf(rest, "%d %d", &idx, &mode) == 2 && idx < ngpus) gpus[idx].mig = mode;
        } else if (!strcmp(word, "migdev") && nmigs < MAX_MIGS) {
            gpu_t *m = &migs[nmigs];
            int parent;
            memset(m, 0, sizeof *m);
            if (sscanf(rest, "%d %d %d %95s %u %u %31s", &m->index, &parent, &m->slot, m->uuid, &m->gi, &m->ci,
                       m->profile) == 7 && parent >= 0 && parent < ngpus) {
                m->parent = &gpus[parent];
                m->lost_at = INFINITY;
                for (int l = 0; l < MAX_LINKS; l++) m->nvlink_peer[l] = -1;
                nmigs++;
            }
        }
    }
    fclose(f);
    qsort(sets, nsets, sizeof *sets, by_series);
    return 1;
}

/* The latest value of KEY for GPU at scenario time t; NAN when never set (-> NOT_SUPPORTED). */
static double value_at(int gpu, int key, double t) {
    double v = NAN; /* the series is in time (then file) order: the last one due wins */
    for (int i = series(gpu, key); i < nsets && sets[i].gpu == gpu && sets[i].key == key && sets[i].t <= t; i++)
        v = sets[i].value;
    return v;
}

/* Integral of KEY (a rate per second) from scenario time 0 to t. */
static double integral(int gpu, int key, double t) {
    double total = 0;
    double times[MAX_SETS + 1];
    int n = 0;
    for (int i = series(gpu, key); i < nsets && sets[i].gpu == gpu && sets[i].key == key && sets[i].t < t; i++)
        times[n++] = sets[i].t < 0 ? 0 : sets[i].t;
    times[n++] = t;
    for (int i = 0; i < n; i++) /* insertion sort: few entries */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double x = times[j]; times[j] = times[j - 1]; times[j - 1] = x;
        }
    for (int i = 0; i + 1 < n; i++) {
        double v = value_at(gpu, key, times[i]);
        if (!isnan(v)) total += v * (times[i + 1] - times[i]);
    }
    return total;
}

static gpu_t *dev(void *handle) { return (gpu_t *)handle; }

static int unsupported(const char *fn, gpu_t *g) {
    for (int i = 0; i < nunsup; i++)
        if (!strcmp(unsup[i].fn, fn) && (unsup[i].gpu < 0 || (g && unsup[i].gpu == g->index))) return 1;
    return 0;
}

/* Calls NVML answers on a MIG device handle; any other returns NOT_SUPPORTED there. */
static const char *MIG_CALLS[] = {"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                                  "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
                                  "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
                                  "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle", NULL};

static int valid(gpu_t *g) { return (g >= gpus && g < gpus + ngpus) || (g >= migs && g < migs + nmigs); }

static int mig_call(const char *fn) {
    for (int i = 0; MIG_CALLS[i]; i++)
        if (!strcmp(MIG_CALLS[i], fn)) return 1;
    return 0;
}

/* The GPU or MIG instance a scenario line names by its index / ID. */
static gpu_t *by_id(int id) {
    for (int i = 0; i < ngpus; i++)
        if (gpus[i].index == id) return &gpus[i];
    for (int i = 0; i < nmigs; i++)
        if (migs[i].index == id) return &migs[i];
    return NULL;
}

/* Common prologue: initialized, valid handle, not lost (nor its parent), a call NVML answers on a MIG
 * device handle, not declared unsupported. */
#define CHECK(fn, handle)                                                                  \
    do {                                                                                   \
        if (!initialized) return UNINIT;                                                   \
        gpu_t *g_ = dev(handle);                                                           \
        if (!valid(g_)) return INVALID;                                                    \
        if (now_s() >= (g_->parent ? g_->parent : g_)->lost_at) return GPU_LOST;           \
        if (g_->parent && !mig_call(fn)) return NOT_SUPPORTED;                             \
        if (unsupported(fn, g_)) return NOT_SUPPORTED;                                     \
    } while (0)

static nvmlReturn_t get_uint(void *h, int key, unsigned *out) {
    double v = value_at(dev(h)->index, key, now_s());
    if (isnan(v)) return NOT_SUPPORTED;
    *out = (unsigned)v;
    return OK;
}

/* ---- init, system ---- */
nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (!load()) return 9; /* DRIVER_NOT_LOADED */
    initialized = 1;
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case UNINIT: return "Uninitialized";
    case INVALID: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT: return "Insufficient Size";
    case TIMEOUT: return "Timeout";
    case GPU_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    if (!initialized) return UNINIT;
    snprintf(buf, len, "%s", driver);
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = cuda; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = cuda; return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!initialized) return UNINIT;
    *n = ngpus;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (!initialized) return UNINIT;
    if (i >= (unsigned)ngpus) return INVALID;
    *h = &gpus[i];
    return OK;
}

/* ---- identity ---- */
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *buf, unsigned len) {
    CHECK("nvmlDeviceGetUUID", h);
    snprintf(buf, len, "%s", dev(h)->uuid);
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *buf, unsigned len) {
    CHECK("nvmlDeviceGetName", h);
    gpu_t *g = dev(h);
    if (g->parent) snprintf(buf, len, "%s MIG %s", g->parent->name, g->profile); /* as nvidia-smi -L shows it */
    else snprintf(buf, len, "%s", g->name);
    return OK;
}
nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned *i) { CHECK("nvmlDeviceGetIndex", h); *i = dev(h)->index; return OK; }
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
    CHECK("nvmlDeviceGetMinorNumber", h);
    *m = dev(h)->minor;
    return OK;
}
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;
static void fill_pci(gpu_t *g, pci_t *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->busid);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", g->busid + (strlen(g->busid) > 12 ? 4 : 0));
    sscanf(g->busid, "%x:%x:%x", &p->domain, &p->bus, &p->device);
    p->pciDeviceId = 0x233010de;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) { CHECK("nvmlDeviceGetPciInfo_v3", h); fill_pci(dev(h), p); return OK; }

/* ---- utilization, power, temperature, clocks, memory ---- */
typedef struct { unsigned gpu, memory; } util_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
    CHECK("nvmlDeviceGetUtilizationRates", h);
    if (dev(h)->mig) return NOT_SUPPORTED; /* "On MIG-enabled GPUs, querying device utilization rates is not
                                              currently supported." */
    if (get_uint(h, K_SM, &u->gpu) || get_uint(h, K_MEM, &u->memory)) return NOT_SUPPORTED;
    return OK;
}
#define ENGINE(NAME, KEY)                                              \
    nvmlReturn_t NAME(void *h, unsigned *u, unsigned *period) {       \
        CHECK(#NAME, h);                                               \
        *period = 167000;                                              \
        return get_uint(h, KEY, u);                                    \
    }
ENGINE(nvmlDeviceGetEncoderUtilization, K_ENC)
ENGINE(nvmlDeviceGetDecoderUtilization, K_DEC)
ENGINE(nvmlDeviceGetJpgUtilization, K_JPG)
ENGINE(nvmlDeviceGetOfaUtilization, K_OFA)

nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned *mw) { CHECK("nvmlDeviceGetPowerUsage", h); return get_uint(h, K_POWER, mw); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *mw) {
    CHECK("nvmlDeviceGetEnforcedPowerLimit", h);
    return get_uint(h, K_POWER_LIMIT, mw);
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj) {
    CHECK("nvmlDeviceGetTotalEnergyConsumption", h);
    if (isnan(value_at(dev(h)->index, K_POWER, now_s()))) return NOT_SUPPORTED;
    *mj = (unsigned long long)integral(dev(h)->index, K_POWER, now_s()); /* mW * s = mJ */
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned *c) {
    CHECK("nvmlDeviceGetTemperature", h);
    if (sensor != 0) return INVALID;
    return get_uint(h, K_TEMP, c);
}
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned *mhz) {
    CHECK("nvmlDeviceGetClockInfo", h);
    if (type == 1) return get_uint(h, K_SMCLK, mhz);
    if (type == 2) return get_uint(h, K_MEMCLK, mhz);
    return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(void *h, int type, unsigned *mhz) {
    CHECK("nvmlDeviceGetMaxClockInfo", h);
    if (type == 1) return get_uint(h, K_SMCLK_MAX, mhz);
    if (type == 2) return get_uint(h, K_MEMCLK_MAX, mhz);
    return NOT_SUPPORTED;
}
typedef struct { unsigned long long total, free, used; } mem_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    CHECK("nvmlDeviceGetMemoryInfo", h);
    double t = now_s(), total = value_at(dev(h)->index, K_FB_TOTAL, t), used = value_at(dev(h)->index, K_FB_USED, t);
    if (isnan(total) || isnan(used)) return NOT_SUPPORTED;
    m->total = (unsigned long long)(total * 1048576.0);
    m->used = (unsigned long long)(used * 1048576.0);
    m->free = m->total - m->used;
    return OK;
}
/* v2 (nvidia-smi's view): used excludes what the driver reserves; total = reserved + used + free. */
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2_t;
#define NVML_MEMORY_V2 0x02000028u
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, mem_v2_t *m) {
    CHECK("nvmlDeviceGetMemoryInfo_v2", h);
    if (m->version != NVML_MEMORY_V2) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    double t = now_s(), total = value_at(dev(h)->index, K_FB_TOTAL, t), used = value_at(dev(h)->index, K_FB_USED, t);
    double reserved = value_at(dev(h)->index, K_FB_RESERVED, t);
    if (isnan(total) || isnan(used)) return NOT_SUPPORTED;
    m->total = (unsigned long long)(total * 1048576.0);
    m->used = (unsigned long long)(used * 1048576.0);
    m->reserved = isnan(reserved) ? 0 : (unsigned long long)(reserved * 1048576.0);
    m->free = m->total - m->used - m->reserved;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(void *h, unsigned *mw) {
    CHECK("nvmlDeviceGetPowerManagementDefaultLimit", h);
    return get_uint(h, K_POWER_DEFAULT, mw);
}
nvmlReturn_t nvmlDeviceGetEccMode(void *h, unsigned *current, unsigned *pending) {
    CHECK("nvmlDeviceGetEccMode", h);
    nvmlReturn_t r = get_uint(h, K_ECC_MODE, current);
    if (r == OK) *pending = *current;
    return r;
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(void *h, unsigned *mode) {
    CHECK("nvmlDeviceGetPersistenceMode", h);
    return get_uint(h, K_PERSISTENCE, mode);
}

/* ---- PCIe, NVLink, throttling, errors ---- */
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *h, int counter, unsigned *kbs) {
    CHECK("nvmlDeviceGetPcieThroughput", h);
    return get_uint(h, counter == 1 ? K_PCIE_RX : K_PCIE_TX, kbs);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { CHECK("nvmlDeviceGetCurrPcieLinkGeneration", h); return get_uint(h, K_PCIE_GEN, v); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { CHECK("nvmlDeviceGetCurrPcieLinkWidth", h); return get_uint(h, K_PCIE_WIDTH, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *v) { CHECK("nvmlDeviceGetMaxPcieLinkGeneration", h); return get_uint(h, K_PCIE_GEN_MAX, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *v) { CHECK("nvmlDeviceGetMaxPcieLinkWidth", h); return get_uint(h, K_PCIE_WIDTH_MAX, v); }
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(void *h, unsigned *v) { CHECK("nvmlDeviceGetPcieReplayCounter", h); return get_uint(h, K_REPLAY, v); }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *mask) {
    CHECK("nvmlDeviceGetCurrentClocksEventReasons", h);
    double v = value_at(dev(h)->index, K_CLKEV, now_s());
    if (isnan(v)) return NOT_SUPPORTED;
    *mask = (unsigned long long)v;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *h, int type, int counter, unsigned long long *n) {
    CHECK("nvmlDeviceGetTotalEccErrors", h);
    (void)counter;
    double v = value_at(dev(h)->index, type == 0 ? K_ECC_SBE : K_ECC_DBE, now_s());
    if (isnan(v)) return NOT_SUPPORTED;
    *n = (unsigned long long)v;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(void *h, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *fail) {
    CHECK("nvmlDeviceGetRemappedRows", h);
    if (get_uint(h, K_REMAP_CORR, corr) || get_uint(h, K_REMAP_UNC, unc) || get_uint(h, K_REMAP_PENDING, pending) ||
        get_uint(h, K_REMAP_FAIL, fail))
        return NOT_SUPPORTED;
    return OK;
}
/* Field ids NVML documents as the same reading as a call, and the scenario key that call serves. */
enum { VT_UINT = 1, VT_ULL = 3 };
static const struct { unsigned id; int key, type; } FIELD_KEYS[] = {
    {3, K_ECC_SBE, VT_ULL},       /* NVML_FI_DEV_ECC_SBE_VOL_TOTAL = nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE) */
    {4, K_ECC_DBE, VT_ULL},       /* NVML_FI_DEV_ECC_DBE_VOL_TOTAL */
    {82, K_MEMTEMP, VT_UINT},     /* NVML_FI_DEV_MEMORY_TEMP */
    {94, K_REPLAY, VT_UINT},      /* NVML_FI_DEV_PCIE_REPLAY_COUNTER = nvmlDeviceGetPcieReplayCounter */
    {142, K_REMAP_CORR, VT_UINT}, /* NVML_FI_DEV_REMAPPED_COR/UNC/PENDING/FAILURE = nvmlDeviceGetRemappedRows */
    {143, K_REMAP_UNC, VT_UINT},
    {144, K_REMAP_PENDING, VT_UINT},
    {145, K_REMAP_FAIL, VT_UINT},
    {185, K_POWER, VT_UINT},      /* NVML_FI_DEV_POWER_AVERAGE, mW (scope 0: the GPU) */
    {186, K_POWER, VT_UINT},      /* NVML_FI_DEV_POWER_INSTANT, mW */
};
typedef union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } value_t;
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    value_t value;
} field_t;
nvmlReturn_t nvmlDeviceGetFieldValues(void *h, int count, field_t *values) {
    CHECK("nvmlDeviceGetFieldValues", h);
    double t = now_s();
    int idx = dev(h)->index;
    for (int i = 0; i < count; i++) {
        field_t *f = &values[i];
        f->timestamp = (long long)((t + start_epoch) * 1e6);
        f->latencyUsec = 0;
        f->valueType = VT_ULL; /* unsigned long long, as NVML gives its counters */
        double v = NAN;
        char name[16];
        snprintf(name, sizeof name, "fi.%u", f->fieldId);
        if (f->fieldId == 83) { /* NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ: the integral of power */
            if (!isnan(value_at(idx, K_POWER, t))) v = integral(idx, K_POWER, t);
        } else if (f->fieldId == 138 || f->fieldId == 139) { /* NVLINK_THROUGHPUT_DATA_TX/RX, KiB counters */
            int key = f->fieldId == 138 ? K_NVL_TX : K_NVL_RX;
            if (!isnan(value_at(idx, key, t))) v = integral(idx, key, t) * 1000.0 / 1024.0;
        } else {
            v = value_at(idx, FIELD_KEY(f->fieldId), t);
            for (size_t k = 0; k < sizeof FIELD_KEYS / sizeof *FIELD_KEYS; k++)
                if (FIELD_KEYS[k].id == f->fieldId) {
                    v = value_at(idx, FIELD_KEYS[k].key, t);
                    f->valueType = FIELD_KEYS[k].type;
                }
        }
        if (isnan(v) || unsupported("field", dev(h)) || unsupported(name, dev(h))) {
            f->nvmlReturn = NOT_SUPPORTED;
        } else {
            f->nvmlReturn = OK;
            if (f->valueType == VT_UINT) f->value.ui = (unsigned)v;
            else f->value.ull = (unsigned long long)v;
        }
    }
    return OK;
}

/* ---- processes ---- */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } procinfo_t;
typedef struct { unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil; } procutil_t;

/* A procfile line's PID: what its file says now (0 until it exists). */
static void read_pidfiles(void) {
    for (int i = 0; i < nprocs; i++) {
        if (!procs[i].pidfile[0]) continue;
        FILE *f = fopen(procs[i].pidfile, "r");
        if (!f) continue;
        if (fscanf(f, "%u", &procs[i].pid) != 1) procs[i].pid = 0;
        fclose(f);
    }
}
/* Processes alive on GPU idx at time t (latest proc/procend line per pid decides). */
static int running(int idx, double t, proc_t **out, int max) {
    int n = 0;
    read_pidfiles();
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].gpu != idx || procs[i].t > t || procs[i].pid == 0) continue;
        proc_t *latest = &procs[i];
        for (int j = 0; j < nprocs; j++)
            if (procs[j].gpu == idx && procs[j].pid == procs[i].pid && procs[j].t <= t && procs[j].t >= latest->t)
                latest = &procs[j];
        if (latest != &procs[i] || latest->end) continue;
        if (n < max) out[n] = latest;
        n++;
    }
    return n;
}
/* Processes on a GPU, a MIG instance, or (a parent in MIG mode: NVML's aggregate) on all its instances. */
static int running_on(gpu_t *g, double t, proc_t **found, gpu_t **where) {
    int n = 0;
    for (int m = -1; m < nmigs; m++) {
        gpu_t *src = m < 0 ? g : &migs[m];
        if (m >= 0 && !(g->mig && migs[m].parent == g)) continue;
        int k = running(src->index, t, found + n, MAX_PROCS - n);
        k = k > MAX_PROCS - n ? MAX_PROCS - n : k;
        for (int i = 0; i < k; i++) where[n + i] = src;
        n += k;
    }
    return n;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count, procinfo_t *infos) {
    CHECK("nvmlDeviceGetComputeRunningProcesses_v3", h);
    proc_t *found[MAX_PROCS];
    gpu_t *where[MAX_PROCS];
    int n = running_on(dev(h), now_s(), found, where);
    if (n == 0) { *count = 0; return OK; }
    if (!infos || *count < (unsigned)n) { *count = n; return INSUFFICIENT; }
    for (int i = 0; i < n; i++)
        infos[i] = (procinfo_t){found[i]->pid, (unsigned long long)(found[i]->mem_mib * 1048576.0),
                                where[i]->parent ? where[i]->gi : NO_INSTANCE,
                                where[i]->parent ? where[i]->ci : NO_INSTANCE};
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *h, procutil_t *samples, unsigned *count, unsigned long long last) {
    CHECK("nvmlDeviceGetProcessUtilization", h);
    (void)last;
    if (dev(h)->mig) return NOT_SUPPORTED; /* per-process utilization is not available in MIG mode */
    proc_t *found[MAX_PROCS];
    int n = running(dev(h)->index, now_s(), found, MAX_PROCS);
    if (n == 0) return NOT_FOUND;
    if (!samples || *count < (unsigned)n) { *count = n; return INSUFFICIENT; }
    unsigned long long ts = (unsigned long long)((now_s() + start_epoch) * 1e6);
    for (int i = 0; i < n; i++)
        samples[i] = (procutil_t){found[i]->pid, ts, (unsigned)found[i]->sm, (unsigned)found[i]->mem, 0, 0};
    *count = n;
    return OK;
}

/* ---- events ---- */
typedef struct { void *device; unsigned long long eventType, eventData; unsigned gpuInstanceId, computeInstanceId; } event_t;
static int event_set_token;
static unsigned long long registered[MAX_GPUS];
nvmlReturn_t nvmlEventSetCreate(void **set) { if (!initialized) return UNINIT; *set = &event_set_token; return OK; }
nvmlReturn_t nvmlEventSetFree(void *set) { (void)set; return OK; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    CHECK("nvmlDeviceGetSupportedEventTypes", h);
    *types = 0x1 | 0x2 | 0x8;
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    CHECK("nvmlDeviceRegisterEvents", h);
    (void)set;
    registered[dev(h)->index] |= types;
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, event_t *data, unsigned timeout_ms) {
    (void)set;
    if (!initialized) return UNINIT;
    double deadline = now_s() + timeout_ms / 1000.0;
    for (;;) {
        double t = now_s(), next = deadline;
        for (int i = 0; i < nxids; i++) {
            gpu_t *src = by_id(xids[i].gpu);
            gpu_t *gpu = src && src->parent ? src->parent : src; /* events arrive on the GPU ... */
            if (xids[i].delivered || !gpu || !(registered[gpu->index] & 0x8)) continue;
            if (xids[i].t <= t) {
                xids[i].delivered = 1;
                memset(data, 0, sizeof *data);
                data->device = gpu;
                data->eventType = 0x8;
                data->eventData = xids[i].code;
                data->gpuInstanceId = src->parent ? src->gi : NO_INSTANCE; /* ... naming the instance, if one */
                data->computeInstanceId = src->parent ? src->ci : NO_INSTANCE;
                return OK;
            }
            if (xids[i].t < next) next = xids[i].t;
        }
        if (t >= deadline) return TIMEOUT;
        /* Block until the next event is due or the timeout, as the driver's wait does. */
        usleep((useconds_t)((next - t) * 1e6) + 1000);
    }
}

/* ---- topology ---- */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, int *level) {
    CHECK("nvmlDeviceGetTopologyCommonAncestor", a);
    *level = levels[dev(a)->index][dev(b)->index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(void *a, void *b, int index, int *status) {
    CHECK("nvmlDeviceGetP2PStatus", a);
    (void)index;
    *status = levels[dev(a)->index][dev(b)->index] <= 30 ? 0 : 5; /* OK, or NOT_SUPPORTED across sockets */
    return OK;
}
nvmlReturn_t nvmlDeviceGetCpuAffinity(void *h, unsigned size, unsigned long *mask) {
    CHECK("nvmlDeviceGetCpuAffinity", h);
    for (unsigned i = 0; i < size; i++) mask[i] = 0;
    if (size) mask[0] = (unsigned long)dev(h)->cpumask;
    return OK;
}
/* The CPU NUMA node nearest the GPU (`nvidia-smi topo -m`'s NUMA Affinity). nvmlDeviceGetNumaNodeId
 * is another thing, the GPU's own memory as a NUMA node, which only coherent platforms (Grace) have:
 * NOT_SUPPORTED here, as on an H200 over PCIe. */
nvmlReturn_t nvmlDeviceGetMemoryAffinity(void *h, unsigned size, unsigned long *mask, int scope) {
    CHECK("nvmlDeviceGetMemoryAffinity", h);
    (void)scope;
    for (unsigned i = 0; i < size; i++) mask[i] = 0;
    if (dev(h)->numa >= 0 && (unsigned)dev(h)->numa < 64 * size) mask[dev(h)->numa / 64] = 1UL << (dev(h)->numa % 64);
    return OK;
}
nvmlReturn_t nvmlDeviceGetNumaNodeId(void *h, int *node) { CHECK("nvmlDeviceGetNumaNodeId", h); (void)node; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetNvLinkState(void *h, unsigned link, unsigned *active) {
    CHECK("nvmlDeviceGetNvLinkState", h);
    if (link >= MAX_LINKS) return INVALID;
    int any = 0;
    for (int l = 0; l < MAX_LINKS; l++) any |= dev(h)->nvlink_peer[l] >= 0;
    if (!any) return NOT_SUPPORTED;
    *active = dev(h)->nvlink_peer[link] >= 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned link, pci_t *p) {
    CHECK("nvmlDeviceGetNvLinkRemotePciInfo_v2", h);
    if (link >= MAX_LINKS || dev(h)->nvlink_peer[link] < 0) return NOT_SUPPORTED;
    fill_pci(&gpus[dev(h)->nvlink_peer[link]], p);
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    CHECK("nvmlDeviceGetMigMode", h);
    *current = *pending = dev(h)->mig;
    return OK;
}

/* ---- GPM (Hopper+): samples are timestamps; metrics are time averages between two samples ---- */
typedef struct { unsigned version, isSupportedDevice; } gpm_support_t;
typedef struct { gpu_t *gpu; double t; } gpm_sample_t;
typedef struct { const char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; metric_info_t info; } gpm_metric_t;
typedef struct { unsigned version, numMetrics; gpm_sample_t *sample1, *sample2; gpm_metric_t metrics[477]; } gpm_get_t;

static int gpm_key(unsigned metric) {
    switch (metric) {
    case 2: return K_GPM_SM;
    case 3: return K_GPM_OCC;
    case 5: return K_GPM_TENSOR;
    case 10: return K_GPM_DRAM;
    case 11: return K_GPM_FP64;
    case 1: return K_GPM_GR;
    case 12: return K_GPM_FP32;
    case 13: return K_GPM_FP16;
    default: return -1;
    }
}
static int gpm_supported(gpu_t *g) {
    for (int k = K_GPM_SM; k <= K_GPM_GR; k++)
        if (series(g->index, k) < nsets) return 1;
    for (int m = 0; m < nmigs; m++) /* a GPU supports GPM if any of its instances does */
        if (migs[m].parent == g && gpm_supported(&migs[m])) return 1;
    return 0;
}
nvmlReturn_t nvmlGpmQueryDeviceSupport(void *h, gpm_support_t *s) {
    CHECK("nvmlGpmQueryDeviceSupport", h);
    s->isSupportedDevice = gpm_supported(dev(h));
    return OK;
}
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **s) {
    *s = calloc(1, sizeof **s);
    return *s ? OK : UNKNOWN;
}
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *s) { free(s); return OK; }
nvmlReturn_t nvmlGpmSampleGet(void *h, gpm_sample_t *s) {
    CHECK("nvmlGpmSampleGet", h);
    if (!gpm_supported(dev(h))) return NOT_SUPPORTED;
    s->gpu = dev(h);
    s->t = now_s();
    return OK;
}
/* GPM of one GPU instance: the parent's handle and the GI id (the first compute instance of that GI). */
nvmlReturn_t nvmlGpmMigSampleGet(void *h, unsigned gi, gpm_sample_t *s) {
    CHECK("nvmlGpmMigSampleGet", h);
    for (int m = 0; m < nmigs; m++)
        if (migs[m].parent == dev(h) && migs[m].gi == gi) {
            if (!gpm_supported(&migs[m])) return NOT_SUPPORTED;
            s->gpu = &migs[m];
            s->t = now_s();
            return OK;
        }
    return dev(h)->mig ? NOT_FOUND : NOT_SUPPORTED;
}
nvmlReturn_t nvmlGpmMetricsGet(gpm_get_t *m) {
    if (!initialized) return UNINIT;
    if (!m->sample1 || !m->sample2 || m->sample1->gpu != m->sample2->gpu || m->sample2->t <= m->sample1->t)
        return INVALID;
    int idx = m->sample1->gpu->index;
    double t1 = m->sample1->t, t2 = m->sample2->t;
    for (unsigned i = 0; i < m->numMetrics && i < 477; i++) {
        int key = gpm_key(m->metrics[i].metricId);
        if (key < 0 || isnan(value_at(idx, key, t2))) {
            m->metrics[i].nvmlReturn = NOT_SUPPORTED;
            continue;
        }
        m->metrics[i].value = (integral(idx, key, t2) - integral(idx, key, t1)) / (t2 - t1);
        m->metrics[i].nvmlReturn = OK;
    }
    return OK;
}

/* ---- MIG ---- */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) {
    CHECK("nvmlDeviceGetMaxMigDeviceCount", h);
    *n = dev(h)->mig ? MAX_MIG_DEVICES : 0; /* zero when MIG is not enabled */
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned index, void **mig) {
    CHECK("nvmlDeviceGetMigDeviceHandleByIndex", h);
    if (!dev(h)->mig || index >= MAX_MIG_DEVICES) return INVALID;
    for (int m = 0; m < nmigs; m++)
        if (migs[m].parent == dev(h) && migs[m].slot == (int)index) {
            *mig = &migs[m];
            return OK;
        }
    return NOT_FOUND; /* no compute instance at that index */
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **parent) {
    CHECK("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h);
    if (!dev(h)->parent) return INVALID;
    *parent = dev(h)->parent;
    return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned *is_mig) {
    CHECK("nvmlDeviceIsMigDeviceHandle", h);
    *is_mig = dev(h)->parent != NULL;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) {
    CHECK("nvmlDeviceGetGpuInstanceId", h);
    if (!dev(h)->parent) return INVALID;
    *id = dev(h)->gi;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) {
    CHECK("nvmlDeviceGetComputeInstanceId", h);
    if (!dev(h)->parent) return INVALID;
    *id = dev(h)->ci;
    return OK;
}
