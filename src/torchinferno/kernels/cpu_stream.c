/* Read-bandwidth probe: every OpenMP thread streams its contiguous slice of a buffer with loads only
 * (eight independent 32-byte accumulators, so the core keeps many cache-line misses in flight, as a
 * decode GEMV does) and folds the lanes into a checksum the caller receives, so no load is dead code.
 *
 * Invariant: reads each byte of [buf, buf + nbytes) exactly once per call and writes nothing but the
 * returned checksum; nbytes is rounded down to a multiple of 256 per thread slice.
 */
#include <stdint.h>
#include <immintrin.h>
#include <omp.h>

int ti_stream_abi_version(void) { return 1; }

uint64_t ti_read_stream(const void *buf, int64_t nbytes, int nthreads) {
    uint64_t total = 0;
    const int64_t chunk = 256;  /* bytes per loop iteration: 8 x 32 */
#pragma omp parallel num_threads(nthreads) reduction(^ : total)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t per = (nbytes / nt) / chunk * chunk;
        const char *p = (const char *)buf + per * t;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t i = 0; i < per; i += chunk) {
            const __m256i *q = (const __m256i *)(p + i);
            a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(q + 0));
            a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(q + 1));
            a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(q + 2));
            a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(q + 3));
            a4 = _mm256_xor_si256(a4, _mm256_loadu_si256(q + 4));
            a5 = _mm256_xor_si256(a5, _mm256_loadu_si256(q + 5));
            a6 = _mm256_xor_si256(a6, _mm256_loadu_si256(q + 6));
            a7 = _mm256_xor_si256(a7, _mm256_loadu_si256(q + 7));
        }
        __m256i a = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)),
                                     _mm256_xor_si256(_mm256_xor_si256(a4, a5), _mm256_xor_si256(a6, a7)));
        uint64_t lanes[4];
        _mm256_storeu_si256((__m256i *)lanes, a);
        total ^= lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
    }
    return total;
}
