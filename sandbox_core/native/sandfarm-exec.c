/* sandfarm-exec: the child-side setup of a local sandbox step, as a tiny program.
 *
 * The Python fallback (sandbox_core.isolation.ChildSetup as preexec_fn) forces
 * subprocess to fork() the whole worker and run Python between fork and exec; with this
 * helper the worker can vfork()+exec at once and the setup runs here, in this order:
 * join cgroups, join the network namespace, rlimits, drop to the slot uid, parent-death
 * signal, no_new_privs, umask, exec.
 *
 * usage: sandfarm-exec [--cgroup FILE]... [--netns-fd FD] [--rlimit RES:SOFT:HARD]...
 *                      [--uid UID --gid GID] [--umask OCTAL] -- PROGRAM ARGS...
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
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what, const char *arg) {
    fprintf(stderr, "sandfarm-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(127);
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
    execvp(argv[i], argv + i);
    die("exec", argv[i]);
    return 127;
}
