"""Can this machine's CPUs run two SIMD streams at once? (issue 26 item 3)

Compiles a small C program (the system `cc`) that runs independent chains of one vector
operation (AVX2 FMA on 8 floats, AVX-512 VNNI vpdpbusd on 64 bytes where the CPU has it) on 1
thread and on 2 threads at the same time, and prints the aggregate rate of each and their ratio:
about 2.0 means two full SIMD streams (two cores, or hyperthreads with their own units); about
1.0 means the two vCPUs share one core's vector units (or the host runs them on one). On a
loaded machine the wall-clock rates say little; the rate per second of each thread's own CPU
time is printed too (a vCPU that is a hyperthread of a busy core shows a low rate there).

    python -m needlepoint_bench.simd_streams [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef struct { int kind; long iters; double sink, cpu; } job;

__attribute__((target("avx2,fma"))) static double fma_chains(long iters) {
    __m256 a[10], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 10; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 10; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    float out[8], s = 0;
    for (int i = 0; i < 10; i++) { _mm256_storeu_ps(out, a[i]); s += out[0]; }
    return s;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_chains(long iters) {
    __m512i a[10], x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
    for (int i = 0; i < 10; i++) a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 10; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    int out[16], s = 0;
    for (int i = 0; i < 10; i++) { _mm512_storeu_si512(out, a[i]); s += out[0]; }
    return s;
}

static void *run(void *arg) {
    job *j = arg;
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    j->sink = j->kind ? vnni_chains(j->iters) : fma_chains(j->iters);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    j->cpu = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
    return NULL;
}

int main(int argc, char **argv) {
    int kind = atoi(argv[1]), threads = atoi(argv[2]);
    long iters = atol(argv[3]);
    job jobs[2] = {{kind, iters, 0, 0}, {kind, iters, 0, 0}};
    pthread_t ids[2];
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&ids[i], NULL, run, &jobs[i]);
    for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    double dt = now() - t0;
    /* operations per second of wall time (all threads) and per second of a thread's own CPU
     * time: iters * 10 chains vector instructions per thread */
    double cpu = jobs[0].cpu + (threads > 1 ? jobs[1].cpu : 0.0);
    printf("%.6f %g %g\n", dt, (double)iters * 10 * threads / dt,
           (double)iters * 10 * threads / cpu);
    return (int)(jobs[0].sink == 12345.0);
}
"""


def _cpu_has(flag: str) -> bool:
    return flag in Path("/proc/cpuinfo").read_text().split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per run, roughly")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "simd_streams"
        src = Path(tmp) / "simd_streams.c"
        src.write_text(SOURCE)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-lpthread"], check=True)
        kinds = [(0, "AVX2 FMA (8 x f32)")]
        if _cpu_has("avx512_vnni"):
            kinds.append((1, "AVX-512 VNNI vpdpbusd (64 x u8.s8)"))
        print(f"load average before: {os.getloadavg()}")
        for kind, name in kinds:
            probe = float(subprocess.run([str(exe), str(kind), "1", "2000000"], check=True,
                                         capture_output=True, text=True).stdout.split()[0])
            iters = str(int(2e6 * args.seconds / max(probe, 1e-4)))
            rates: dict[int, float] = {}
            per_cpu: dict[int, float] = {}
            for threads in (1, 2, 1, 2):  # interleaved, the best of two each
                out = subprocess.run([str(exe), str(kind), str(threads), iters], check=True,
                                     capture_output=True, text=True).stdout.split()
                rates[threads] = max(rates.get(threads, 0.0), float(out[1]))
                per_cpu[threads] = max(per_cpu.get(threads, 0.0), float(out[2]))
            print(f"{name}: 1 thread {rates[1] / 1e9:.2f} G vector ops/s, 2 threads "
                  f"{rates[2] / 1e9:.2f} G/s aggregate, ratio {rates[2] / rates[1]:.2f}; per "
                  f"second of a thread's own CPU time {per_cpu[1] / 1e9:.2f} alone, "
                  f"{per_cpu[2] / 1e9:.2f} two at once (a loaded machine lowers the first "
                  "figures, not these)")
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
