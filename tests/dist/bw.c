/* bw.c - MPI bandwidth probe for scripts/netns-cluster.
 *
 * Build: mpicc -O2 -o /tmp/bw tests/dist/bw.c
 * Usage: bw [MiB=64] [iters=3]
 *
 * Each rank reports its network namespace (inode of /proc/self/ns/net) so a
 * run can prove the ranks really live in different namespaces.  Then:
 *   sendrecv : ring exchange, rank r sends MiB to r+1 and receives from r-1
 *              (so every link carries MiB in each direction at the same time).
 *              Reported: MB/s per rank and direction.
 *   allreduce: MPI_Allreduce(SUM) of MiB of doubles.  Reported: algorithm
 *              bandwidth (size/time) and "bus" bandwidth = algbw*2(n-1)/n,
 *              which is what each link carries per direction for a
 *              bandwidth-optimal allreduce, i.e. comparable to the link rate.
 *   pingpong : 8-byte ping-pong between ranks 0 and 1, 1000 round trips
 *              (after 100 untimed ones).  Reported: one-way latency in us.
 * One untimed warm-up of each op runs first.  The last line gives the MPI
 * payload each rank sent in total (warm-up included), to compare with the
 * interface byte counters.  Exit status is non-zero if a result is wrong. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach mpiexec even if a rank is killed */
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    int iters = argc > 2 ? atoi(argv[2]) : 3;
    if (mib == 0) mib = 1;
    if (iters < 1) iters = 1;
    size_t bytes = mib << 20, cnt = bytes / sizeof(double);

    /* Which network namespace is this rank in? */
    char ns[64] = "?", host[64] = "?", line[256];
    ssize_t l = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (l > 0) ns[l] = 0;
    gethostname(host, sizeof host);
    snprintf(line, sizeof line, "rank %d/%d pid %d host %s netns %s", rank, n,
             (int)getpid(), host, ns);
    char *all = rank ? NULL : malloc((size_t)n * sizeof line);
    MPI_Gather(line, sizeof line, MPI_CHAR, all, sizeof line, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    if (!rank) {
        for (int i = 0; i < n; i++) printf("%s\n", all + (size_t)i * sizeof line);
        free(all);
    }

    /* --- pingpong latency (ranks 0 and 1) --- */
    if (n > 1) {
        char msg[8] = {0};
        double t = 0;
        for (int it = 0; it < 1100; it++) {
            if (it == 100) { MPI_Barrier(MPI_COMM_WORLD); t = MPI_Wtime(); }
            if (rank == 0) {
                MPI_Send(msg, 8, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(msg, 8, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                MPI_Recv(msg, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(msg, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
            }
        }
        t = MPI_Wtime() - t;
        if (!rank) printf("pingpong     8 B x1000: %.1f us one-way latency\n", t / 2000 * 1e6);
    }

    double *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    int bad = 0, right = (rank + 1) % n, left = (rank + n - 1) % n;

    /* --- sendrecv ring --- */
    double best = 1e30;
    for (int it = 0; it <= iters; it++) {
        for (size_t i = 0; i < cnt; i++) a[i] = rank;
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        MPI_Sendrecv(a, (int)cnt, MPI_DOUBLE, right, 1, b, (int)cnt, MPI_DOUBLE,
                     left, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t = MPI_Wtime() - t;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it && t < best) best = t;                /* it 0 = warm-up */
        if (b[0] != left || b[cnt - 1] != left) bad = 1;
    }
    if (!rank)
        printf("sendrecv  %4zu MiB x%d: best %.3f s  %.1f MB/s per rank per direction\n",
               mib, iters, best, bytes / best / 1e6);

    /* --- allreduce --- */
    double besta = 1e30, sum = (double)n * (n - 1) / 2;
    for (int it = 0; it <= iters; it++) {
        for (size_t i = 0; i < cnt; i++) a[i] = rank;
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        MPI_Allreduce(a, b, (int)cnt, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        t = MPI_Wtime() - t;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it && t < besta) besta = t;
        if (b[0] != sum || b[cnt / 2] != sum || b[cnt - 1] != sum) bad = 1;
    }
    if (!rank) {
        double alg = bytes / besta / 1e6;
        printf("allreduce %4zu MiB x%d: best %.3f s  algbw %.1f MB/s  busbw %.1f MB/s\n",
               mib, iters, besta, alg, n > 1 ? alg * 2 * (n - 1) / n : alg);
        /* payload per rank: sendrecv sends `bytes` per iteration; a
         * bandwidth-optimal allreduce sends 2(n-1)/n*bytes per iteration. */
        double per = (iters + 1) * (bytes + (n > 1 ? 2.0 * (n - 1) / n * bytes : 0));
        printf("payload sent per rank ~%.1f MB (%d iterations incl. warm-up)\n",
               per / 1e6, iters + 1);
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!rank) printf("check: %s\n", bad ? "WRONG RESULTS" : "ok");
    free(a); free(b);
    MPI_Finalize();
    return bad;
}
