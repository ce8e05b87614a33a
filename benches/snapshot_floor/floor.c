/* The fork + exit floor of an interpreter whose heap is anonymous, in huge pages, or a
 * memfd snapshot: the same three treatments of memory as the zygote (anonymous as built,
 * worker/src/hugepages.rs, worker/src/snapshot.rs), applied to a plain CPython by
 * floor.py through ctypes, and a fork loop that runs no Python in the parent (as the
 * zygote's Rust loop). Built by floor.py; see its docstring. */
#define _GNU_SOURCE
#include <Python.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANGES 4096
static unsigned long starts[MAX_RANGES], ends[MAX_RANGES];
static char maps[1 << 20];
static unsigned char resident[1 << 20];

/* Private writable anonymous mappings and the brk heap, as hugepages.rs selects them. */
static int anonymous_ranges(void) {
    int fd = open("/proc/self/maps", O_RDONLY), total = 0, r, n = 0;
    while ((r = read(fd, maps + total, sizeof(maps) - 1 - total)) > 0) total += r;
    close(fd);
    maps[total] = 0;
    for (char *line = maps; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        unsigned long s, e, off, ino;
        unsigned maj, min;
        char perms[8];
        int pos = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &s, &e, perms, &off, &maj, &min, &ino,
                   &pos) >= 7) {
            char *path = line + pos;
            while (*path == ' ') path++;
            int anon = *path == 0 || strcmp(path, "[heap]") == 0;
            if (perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p' && anon && n < MAX_RANGES) {
                starts[n] = s;
                ends[n++] = e;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return n;
}

/* Copies each mapping into a memfd and maps it back MAP_PRIVATE; returns bytes or < 0. */
long snapshot(void) {
    int n = anonymous_ranges();
    long total = 0;
    for (int i = 0; i < n; i++) {
        unsigned long len = ends[i] - starts[i], done = 0;
        int fd = syscall(SYS_memfd_create, "snakecage-snapshot", MFD_CLOEXEC);
        if (fd < 0 || syscall(SYS_ftruncate, fd, len) < 0) return -1;
        /* Resident pages only (as snapshot.rs): the rest stay holes, which read as zeros. */
        if (len / 4096 > sizeof(resident) || mincore((void *)starts[i], len, resident)) return -2;
        for (; done < len; done += 4096) {
            if (!(resident[done / 4096] & 1)) continue;
            if (syscall(SYS_pwrite64, fd, (void *)(starts[i] + done), 4096, done) != 4096) return -2;
        }
        void *p = (void *)syscall(SYS_mmap, starts[i], len, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_FIXED, fd, 0);
        if (p != (void *)starts[i]) return -3;
        syscall(SYS_close, fd);
        total += len;
    }
    return total;
}

/* MADV_COLLAPSE on the 2 MiB-aligned parts; returns huge pages made. */
long collapse(void) {
    int n = anonymous_ranges();
    long huge = 0;
    for (int i = 0; i < n; i++) {
        unsigned long s = (starts[i] + (2UL << 20) - 1) & ~((2UL << 20) - 1);
        unsigned long e = ends[i] & ~((2UL << 20) - 1);
        if (e > s && madvise((void *)s, e - s, 25 /* MADV_COLLAPSE */) == 0) huge += (e - s) >> 21;
    }
    return huge;
}

/* Forks n children back to back; each runs `code` (if any) and _exits; the parent reaps. */
int fork_loop(int n, const char *code) {
    for (int i = 0; i < n; i++) {
        PyOS_BeforeFork();
        pid_t pid = fork();
        if (pid == 0) {
            PyOS_AfterFork_Child();
            if (code && *code) PyRun_SimpleString(code);
            _exit(0);
        }
        PyOS_AfterFork_Parent();
        int status;
        waitpid(pid, &status, 0);
    }
    return 0;
}
