/* sandfarm-exec: the child-side setup of a local sandbox step, as a tiny program.
 *
 * The Python fallback (sandbox_core.isolation.ChildSetup as preexec_fn) forces
 * subprocess to fork() the whole worker and run Python between fork and exec; with this
 * helper the worker can vfork()+exec at once and the setup runs here, in this order:
 * join cgroups, join the network namespace, rlimits, drop to the slot uid, parent-death
 * signal, no_new_privs, umask, exec.
 *
 * usage: sandfarm-exec [--cgroup FILE]... [--netns-fd FD] [--private-tmp SIZE_MB]
 *                      [--rlimit RES:SOFT:HARD]... [--uid UID --gid GID] [--umask OCTAL]
 *                      [--env-fd FD] [--seccomp-fd FD] -- PROGRAM ARGS...
 * --seccomp-fd: a classic BPF program (struct sock_filter[]), built by
 * sandbox_core.seccomp, loaded last, just before exec.
 * It is started as root with an EMPTY environment (so the job's LD_PRELOAD and friends
 * never reach a root process); the job's environment arrives NUL-separated on --env-fd
 * and is installed only after the privilege drop, for the final exec.
 * Any failure exits 127 with a message on stderr: the step never runs weaker.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what, const char *arg) {
    fprintf(stderr, "sandfarm-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(127);
}

extern char **environ;

/* Read a NUL-separated KEY=VALUE block from fd into a NULL-terminated vector. */
static char **read_env(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) die("env-fd", NULL);
    size_t size = (size_t)st.st_size;
    char *block = malloc(size + 1);
    if (!block) die("env-fd", "out of memory");
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, block + got, size - got, (off_t)got);
        if (n <= 0) die("env-fd read", NULL);
        got += (size_t)n;
    }
    block[size] = '\0';
    close(fd);
    size_t count = 0;
    for (size_t i = 0; i < size; i++) count += block[i] == '\0';
    char **envp = calloc(count + 2, sizeof *envp);
    if (!envp) die("env-fd", "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < size; i += strlen(block + i) + 1)
        if (block[i]) envp[n++] = block + i;
    envp[n] = NULL;
    return envp;
}

/* A private mount and IPC namespace: fresh tmpfs over the host's shared writable
 * directories and /run (its unix sockets: databases, brokers), a fresh mqueue, and a
 * /proc that shows only the job's own processes. Nothing a job leaves there survives
 * it or reaches another slot; nothing another slot runs is visible to it.
 * Keep in step with sandbox_core.isolation.private_tmp (the Python fallback). */
static void private_tmp(const char *size_mb) {
    if (unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0) die("unshare", "mount+ipc");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("make / private", NULL);
    static const char *dirs[] = {"/tmp", "/var/tmp", "/dev/shm", "/run", NULL};
    char opts[64], real[4096];
    snprintf(opts, sizeof opts, "size=%sm,mode=1777", size_mb);
    for (int i = 0; dirs[i]; i++) {
        struct stat st;
        if (!realpath(dirs[i], real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (mount("tmpfs", real, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0)
            die("mount tmpfs on", real);
    }
    if (mkdir("/run/lock", 01777) != 0 && errno != EEXIST) die("mkdir", "/run/lock");
    chmod("/run/lock", 01777);
    struct stat st;
    if (stat("/dev/mqueue", &st) == 0 && S_ISDIR(st.st_mode) &&
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        die("mount mqueue on", "/dev/mqueue");
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible") != 0)
        die("mount proc", "hidepid=invisible");
}

static void load_seccomp(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter))
        die("seccomp-fd", "bad program");
    struct sock_filter *prog = malloc((size_t)st.st_size);
    if (!prog || pread(fd, prog, (size_t)st.st_size, 0) != st.st_size) die("seccomp-fd", NULL);
    close(fd);
    struct sock_fprog fprog = {(unsigned short)(st.st_size / sizeof *prog), prog};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) die("seccomp", NULL);
}

static unsigned long long number(const char *text, const char *what) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 0);
    if (errno || end == text) die("bad number for", what);
    return value;
}

int main(int argc, char **argv) {
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    long uid = -1, gid = -1;
    mode_t mask = 022;
    char **job_env = NULL;
    int seccomp_fd = -1;
    int i = 1;
    for (; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--") == 0) { i++; break; }
        if (i + 1 >= argc) { errno = EINVAL; die("missing value for", opt); }
        const char *val = argv[++i];
        if (strcmp(opt, "--cgroup") == 0) {
            int fd = open(val, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, pid, strlen(pid)) < 0) die("join cgroup", val);
            close(fd);
        } else if (strcmp(opt, "--netns-fd") == 0) {
            int fd = (int)number(val, opt);
            if (setns(fd, CLONE_NEWNET) != 0) die("setns", val);
            close(fd); /* the job must not inherit it */
        } else if (strcmp(opt, "--rlimit") == 0) {
            unsigned long long res, soft, hard;
            if (sscanf(val, "%llu:%llu:%llu", &res, &soft, &hard) != 3) {
                errno = EINVAL;
                die("bad rlimit", val);
            }
            struct rlimit lim = {(rlim_t)soft, (rlim_t)hard};
            if (setrlimit((int)res, &lim) != 0) die("setrlimit", val);
        } else if (strcmp(opt, "--private-tmp") == 0) {
            number(val, opt);
            private_tmp(val);
        } else if (strcmp(opt, "--seccomp-fd") == 0) {
            seccomp_fd = (int)number(val, opt);
        } else if (strcmp(opt, "--env-fd") == 0) {
            job_env = read_env((int)number(val, opt));
        } else if (strcmp(opt, "--uid") == 0) {
            uid = (long)number(val, opt);
        } else if (strcmp(opt, "--gid") == 0) {
            gid = (long)number(val, opt);
        } else if (strcmp(opt, "--umask") == 0) {
            mask = (mode_t)strtoul(val, NULL, 8);
        } else {
            errno = EINVAL;
            die("unknown option", opt);
        }
    }
    if (i >= argc) { errno = EINVAL; die("no program given", NULL); }
    if (uid >= 0) {
        if (gid < 0) gid = uid;
        if (setgroups(0, NULL) != 0) die("setgroups", NULL);
        if (setresgid(gid, gid, gid) != 0) die("setresgid", NULL);
        if (setresuid(uid, uid, uid) != 0) die("setresuid", NULL);
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) die("pdeathsig", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs", NULL);
    umask(mask);
    if (seccomp_fd >= 0) load_seccomp(seccomp_fd); /* last: after no_new_privs */
    static char *empty[] = {NULL};
    environ = job_env ? job_env : empty; /* only now, as the job's uid */
    execvp(argv[i], argv + i);
    die("exec", argv[i]);
    return 127;
}
