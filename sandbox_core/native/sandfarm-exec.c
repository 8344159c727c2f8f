/* sandfarm-exec: the child-side setup of a local sandbox step, as a tiny program.
 *
 * The Python fallback (sandbox_core.isolation.ChildSetup as preexec_fn) forces
 * subprocess to fork() the whole worker and run Python between fork and exec; with this
 * helper the worker can vfork()+exec at once and the setup runs here, in this order:
 * join cgroups, join the network namespace, rlimits, drop to the slot uid, parent-death
 * signal, no_new_privs, Landlock scopes, umask, exec.
 *
 * usage: sandfarm-exec [--cgroup FILE]... [--netns-fd FD] [--private-tmp SIZE_MB
 *                      [--devpts MAX] [--hide-under DIR --keep DIR]]
 *                      [--rlimit RES:SOFT:HARD]... [--uid UID --gid GID] [--umask OCTAL]
 *                      [--env-fd FD] [--seccomp-fd FD] [--landlock-scope BITS]
 *                      [--landlock-sock-dir DIR]... [--direct N] -- PROGRAM ARGS...
 *        sandfarm-exec [the same setup options] --standby FD --
 *        sandfarm-exec --init STATUS_FD [--direct N] -- PROGRAM ARGS...
 *        sandfarm-exec --init STATUS_FD --standby FD --
 * Options act in the order given (--devpts and --hide-under need --private-tmp first;
 * --private-tmp mounts a sysfs of the network namespace it finds, so --netns-fd first).
 * --devpts: the job's own pty instance (at most MAX ptys: the host's table is shared).
 * --hide-under/--keep: unmount, in the job's mount namespace only, every mount under DIR
 * but KEEP (other jobs' workspaces would show in /proc/self/mountinfo).
 * --init: run as the sandbox's pid 1 (bwrap --as-pid-1): start PROGRAM, reap every
 * process, and once PROGRAM ends kill the rest and write its real wait status and
 * resource use to STATUS_FD ("status=N cpu_us=N maxrss_kb=N\n"), which PROGRAM never
 * holds: an exit code the job chooses can never pass for a signal.
 * --direct N: the first N words of PROGRAM ARGS are a simple command, exec'd without a
 * shell (the candidate bash would pick on the job's PATH: the first that exists, is no
 * directory and is executable); if there is none or its exec fails (nothing ran yet)
 * the rest of the words, the same command as a bash script, run instead, so a failure
 * keeps bash's own message and exit status.
 * --standby FD: a sandbox made before its job arrived (sandbox_core.backends.prewarm).
 * After the whole setup but the seccomp filter (as the slot uid, no_new_privs), or as
 * init before it forks, wait for the job on FD: NUL-terminated fields "D<direct>",
 * "R<res>:<soft>:<hard>" (rlimits, which the job's uid can only lower), "E<KEY=VALUE>"
 * (its environment), "A<word>" (its argv), then "." and EOF. Anything else, or EOF
 * before ".", ends the standby (the worker died or gave up on it): nothing runs.
 * --landlock-scope BITS, --landlock-sock-dir DIR: a Landlock domain, after no_new_privs,
 * with these scopes (LANDLOCK_SCOPE_*, Linux 6.12; 1: no abstract Unix socket made
 * outside the job) and, given any DIR, Unix socket files made only beneath those (as
 * they are once --private-tmp is done): sandbox_core.landlock says why.
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
#include <sys/syscall.h>
#include <sys/wait.h>
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
    char opts[96], real[4096];
    /* Inodes bounded, a quarter of the workspace's bound each: the kernel evicts them in
     * the exit of the job's last process, which must end within the slot's kill. */
    unsigned long long inodes = strtoull(size_mb, NULL, 10) * 64;
    snprintf(opts, sizeof opts, "size=%sm,nr_inodes=%llu,mode=1777", size_mb,
             inodes < 1024 ? 1024ULL : inodes);
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
    /* A sysfs of the job's own network namespace (joined before this): the host's showed
     * the host's interfaces and counters, its loopback's the workers' traffic with Redis. */
    unsigned long sys_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (stat("/sys", &st) == 0 && S_ISDIR(st.st_mode) &&
        mount("sysfs", "/sys", "sysfs", sys_flags | MS_RDONLY, NULL) != 0) {
        /* The host's namespace (a network job): the kernel makes no second sysfs of it
         * (EBUSY), so the host's is bound, without its submounts, read-only. It was
         * not: network jobs on L1 failed to start. */
        if (errno != EBUSY || mount("/sys", "/sys", NULL, MS_BIND, NULL) != 0 ||
            mount(NULL, "/sys", NULL, sys_flags | MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0)
            die("mount sysfs on", "/sys");
    }
    /* The host's cgroup tree out of view (every slot's counters: what another tenant's
     * job, or the slot's last one, used): an empty read-only tmpfs, as bwrap and docker. */
    if (stat("/sys/fs/cgroup", &st) == 0 && S_ISDIR(st.st_mode) &&
        mount("tmpfs", "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
              "size=4k,mode=0555") != 0)
        die("mount tmpfs on", "/sys/fs/cgroup");
}

/* A devpts instance of the job's own, at most max ptys, over /dev/pts and /dev/ptmx. */
static void private_devpts(const char *max) {
    char opts[96];
    snprintf(opts, sizeof opts, "newinstance,ptmxmode=0666,mode=0620,max=%s", max);
    if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, opts) != 0)
        die("mount devpts", opts);
    if (mount("/dev/pts/ptmx", "/dev/ptmx", NULL, MS_BIND, NULL) != 0)
        die("bind", "/dev/pts/ptmx");
}

/* Decode mountinfo's octal escapes (\040 for a space, ...) in place. */
static void unescape(char *text) {
    char *out = text;
    for (char *in = text; *in; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '7' && in[2] && in[3]) {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

static int under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* In this (private) mount namespace, unmount every mount under dir except keep and its
 * own submounts, deepest first. */
static void hide_mounts(const char *dir, const char *keep) {
    FILE *info = fopen("/proc/self/mountinfo", "r");
    if (!info) die("open", "/proc/self/mountinfo");
    char line[8192];
    char **found = NULL;
    size_t count = 0;
    while (fgets(line, sizeof line, info)) {
        char *field = strtok(line, " ");
        for (int i = 1; field && i < 5; i++) field = strtok(NULL, " ");
        if (!field) continue;
        unescape(field);
        if (!under(field, dir) || strcmp(field, dir) == 0 || under(field, keep)) continue;
        found = realloc(found, (count + 1) * sizeof *found);
        if (!found || !(found[count++] = strdup(field))) die("hide mounts", "out of memory");
    }
    fclose(info);
    while (count > 0) {
        char *target = found[--count];
        if (umount2(target, MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT)
            die("umount", target);
        free(target);
    }
    free(found);
}

/* Whether bash would take `file` as the command: it exists, is no directory, and the
 * job (whose uid this already is) may execute it. */
static int runnable(const char *file) {
    struct stat st;
    return stat(file, &st) == 0 && !S_ISDIR(st.st_mode) &&
           faccessat(AT_FDCWD, file, X_OK, AT_EACCESS) == 0;
}

/* execve the command bash would pick on PATH (the first runnable candidate), and only
 * that one; returns if there is none or its exec fails: the bash script then runs and
 * says why in bash's words (a missing #! interpreter, a FIFO, ...). */
static void exec_on_path(char **argv) {
    const char *name = argv[0];
    if (!*name) return;
    if (strchr(name, '/')) {
        execve(name, argv, environ);
        return;
    }
    const char *path = getenv("PATH");
    if (!path) return;
    size_t len = strlen(name);
    char file[4096];
    for (const char *dir = path;; ) {
        const char *end = strchrnul(dir, ':');
        size_t dlen = (size_t)(end - dir);
        const char *base = dlen ? dir : "."; /* an empty entry: the working directory */
        if (!dlen) dlen = 1;
        if (dlen + 1 + len < sizeof file) {
            memcpy(file, base, dlen);
            file[dlen] = '/';
            memcpy(file + dlen + 1, name, len + 1);
            if (runnable(file)) {
                execve(file, argv, environ);
                return;
            }
        }
        if (!*end) return;
        dir = end + 1;
    }
}

/* Every signal to its default and none blocked, as a fresh login would have them: a
 * signal the worker ignores (Celery's pool ignores SIGINT) or blocks would otherwise
 * stay so in the job (exec keeps SIG_IGN and the mask), and its verdict change with it. */
static void default_signals(void) {
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL); /* EINVAL: glibc's own */
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Exec the step: see --direct above. */
static void exec_step(char **argv, unsigned long long direct) {
    default_signals();
    if (direct > 0) {
        char *rest = argv[direct];
        argv[direct] = NULL;
        exec_on_path(argv);
        argv[direct] = rest;
        argv += direct;
    }
    execvp(argv[0], argv);
}

static unsigned long long number(const char *text, const char *what);
#include "standby.h"

/* pid 1 of a sandbox: see --init above. */
static int run_init(int status_fd, int standby_fd, unsigned long long direct, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* the job may not ptrace or read its monitor */
    struct go go;
    if (standby_fd >= 0) {
        read_go(standby_fd, &go);
        argv = go.argv;
        direct = go.direct;
    }
    pid_t child = fork();
    if (child < 0) die("fork", NULL);
    if (child == 0) {
        close(status_fd);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (standby_fd >= 0) {
            apply_rlimits(&go);
            environ = go.env;
        }
        exec_step(argv, direct);
        die("exec", argv[direct]);
    }
    int status = 0, main_status = -1;
    struct rusage usage, main_usage;
    memset(&main_usage, 0, sizeof main_usage);
    for (;;) {
        pid_t pid = wait4(-1, &status, 0, &usage);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: nothing left */
        }
        if (pid == child) {
            main_status = status;
            main_usage = usage;
            kill(-1, SIGKILL); /* as pid 1: everything else in the sandbox */
        }
    }
    long long cpu_us = (long long)main_usage.ru_utime.tv_sec * 1000000 + main_usage.ru_utime.tv_usec +
                       (long long)main_usage.ru_stime.tv_sec * 1000000 + main_usage.ru_stime.tv_usec;
    dprintf(status_fd, "status=%d cpu_us=%lld maxrss_kb=%ld\n", main_status, cpu_us,
            main_usage.ru_maxrss);
    return 0;
}

#ifndef SYS_landlock_create_ruleset /* the same numbers on x86_64 and aarch64 */
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif
#define LANDLOCK_MAKE_SOCK (1ULL << 9) /* LANDLOCK_ACCESS_FS_MAKE_SOCK */
#define LANDLOCK_REFER (1ULL << 13)    /* LANDLOCK_ACCESS_FS_REFER (ABI 2) */
#define LANDLOCK_PATH_BENEATH 1
#define MOST_SOCK_DIRS 8

/* struct landlock_ruleset_attr as of Landlock ABI 6 (older headers lack scoped); a
 * kernel of an older ABI takes it while scoped is 0 */
struct ruleset_attr {
    unsigned long long handled_access_fs, handled_access_net, scoped;
};
struct path_beneath_attr {
    unsigned long long allowed_access;
    int parent_fd;
} __attribute__((packed));

static void landlock_rule(long ruleset, const char *dir, unsigned long long allowed) {
    struct path_beneath_attr rule = {allowed, open(dir, O_PATH | O_CLOEXEC)};
    if (rule.parent_fd < 0) die("open", dir);
    if (syscall(SYS_landlock_add_rule, (int)ruleset, LANDLOCK_PATH_BENEATH, &rule, 0) != 0)
        die("landlock_add_rule", dir);
    close(rule.parent_fd);
}

/* Given sock_dirs, REFER is handled and granted everywhere: handling any file right
 * refuses every move of a file to another directory otherwise (EXDEV). */
static void landlock_restrict(unsigned long long scoped, const char **sock_dirs, int dirs) {
    struct ruleset_attr attr = {dirs ? LANDLOCK_MAKE_SOCK | LANDLOCK_REFER : 0, 0, scoped};
    long fd = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (fd < 0) die("landlock_create_ruleset", NULL);
    if (dirs) landlock_rule(fd, "/", LANDLOCK_REFER);
    for (int k = 0; k < dirs; k++) landlock_rule(fd, sock_dirs[k], LANDLOCK_MAKE_SOCK);
    if (syscall(SYS_landlock_restrict_self, (int)fd, 0) != 0) die("landlock_restrict_self", NULL);
    close((int)fd);
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
    int seccomp_fd = -1, standby_fd = -1;
    unsigned long long scoped = 0;
    const char *sock_dirs[MOST_SOCK_DIRS];
    int dirs = 0;
    int i = 1;
    unsigned long long direct = 0;
    if (argc > 3 && strcmp(argv[1], "--init") == 0) {
        int status_fd = (int)number(argv[2], "--init");
        int at = 3;
        for (; at + 2 < argc && strcmp(argv[at], "--") != 0; at += 2) {
            if (strcmp(argv[at], "--direct") == 0) {
                direct = number(argv[at + 1], "--direct");
            } else if (strcmp(argv[at], "--standby") == 0) {
                standby_fd = (int)number(argv[at + 1], "--standby");
            } else {
                errno = EINVAL;
                die("usage", argv[at]);
            }
        }
        unsigned long long words = (unsigned long long)(argc - at - 1);
        if (strcmp(argv[at], "--") != 0 || (standby_fd < 0 && words <= direct) ||
            (standby_fd >= 0 && words != 0)) {
            errno = EINVAL;
            die("usage", "--init");
        }
        return run_init(status_fd, standby_fd, direct, argv + at + 1);
    }
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
        } else if (strcmp(opt, "--devpts") == 0) {
            number(val, opt);
            private_devpts(val);
        } else if (strcmp(opt, "--hide-under") == 0) {
            if (i + 2 >= argc || strcmp(argv[i + 1], "--keep") != 0) {
                errno = EINVAL;
                die("--hide-under needs --keep", val);
            }
            hide_mounts(val, argv[i + 2]);
            i += 2;
        } else if (strcmp(opt, "--seccomp-fd") == 0) {
            seccomp_fd = (int)number(val, opt);
        } else if (strcmp(opt, "--landlock-scope") == 0) {
            scoped = number(val, opt);
        } else if (strcmp(opt, "--landlock-sock-dir") == 0) {
            if (dirs == MOST_SOCK_DIRS) {
                errno = E2BIG;
                die("too many", opt);
            }
            sock_dirs[dirs++] = val;
        } else if (strcmp(opt, "--env-fd") == 0) {
            job_env = read_env((int)number(val, opt));
        } else if (strcmp(opt, "--uid") == 0) {
            uid = (long)number(val, opt);
        } else if (strcmp(opt, "--gid") == 0) {
            gid = (long)number(val, opt);
        } else if (strcmp(opt, "--umask") == 0) {
            mask = (mode_t)strtoul(val, NULL, 8);
        } else if (strcmp(opt, "--direct") == 0) {
            direct = number(val, opt);
        } else if (strcmp(opt, "--standby") == 0) {
            standby_fd = (int)number(val, opt);
        } else {
            errno = EINVAL;
            die("unknown option", opt);
        }
    }
    if (standby_fd >= 0 ? i != argc || job_env || direct
                        : i >= argc || (unsigned long long)(argc - i) <= direct) {
        errno = EINVAL;
        die(standby_fd >= 0 ? "--standby takes its program, env and direct from its fd"
                            : "no program given", NULL);
    }
    if (uid >= 0) {
        if (gid < 0) gid = uid;
        if (setgroups(0, NULL) != 0) die("setgroups", NULL);
        if (setresgid(gid, gid, gid) != 0) die("setresgid", NULL);
        if (setresuid(uid, uid, uid) != 0) die("setresuid", NULL);
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) die("pdeathsig", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs", NULL);
    if (scoped || dirs) landlock_restrict(scoped, sock_dirs, dirs); /* needs no_new_privs */
    umask(mask);
    char **program = argv + i;
    if (standby_fd >= 0) { /* the sandbox is ready: now the job */
        struct go go;
        read_go(standby_fd, &go);
        apply_rlimits(&go);
        program = go.argv;
        direct = go.direct;
        job_env = go.env;
    }
    if (seccomp_fd >= 0) load_seccomp(seccomp_fd); /* last: after no_new_privs */
    static char *empty[] = {NULL};
    environ = job_env ? job_env : empty; /* only now, as the job's uid */
    exec_step(program, direct);
    die("exec", program[direct]);
    return 127;
}
