/* sandfarm-exec --standby: reading the job a prewarmed sandbox waits for (included by
 * sandfarm-exec.c, after die() and number(); see --standby there). */
#include <sys/resource.h>

/* The job a standby waits for (see --standby above). */
struct go {
    char **argv;
    char **env;
    unsigned long long direct;
    struct rlimit lims[RLIM_NLIMITS];
    int has_lim[RLIM_NLIMITS];
};

/* Read the job from fd until EOF; exits quietly if the worker never sent all of it. */
static void read_go(int fd, struct go *go) {
    size_t size = 0, cap = 1 << 16;
    char *block = malloc(cap);
    if (!block) die("standby", "out of memory");
    for (;;) {
        if (size == cap && !(block = realloc(block, cap *= 2))) die("standby", "out of memory");
        ssize_t n = read(fd, block + size, cap - size);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die("standby read", NULL);
        if (n == 0) break;
        size += (size_t)n;
    }
    close(fd);
    if (size < 2 || block[size - 1] != '\0' || block[size - 2] != '.' ||
        (size > 2 && block[size - 3] != '\0'))
        _exit(0); /* no job came: the worker gave this sandbox up */
    size_t fields = 0;
    for (size_t i = 0; i < size; i++) fields += block[i] == '\0';
    char **argv = calloc(fields + 1, sizeof *argv), **env = calloc(fields + 1, sizeof *env);
    if (!argv || !env) die("standby", "out of memory");
    size_t argc = 0, envc = 0;
    memset(go, 0, sizeof *go);
    for (size_t i = 0; i + 2 < size; i += strlen(block + i) + 1) {
        char kind = block[i], *value = block + i + 1;
        if (kind == 'A') {
            argv[argc++] = value;
        } else if (kind == 'E') {
            env[envc++] = value;
        } else if (kind == 'D') {
            go->direct = number(value, "standby direct");
        } else if (kind == 'R') {
            unsigned long long res, soft, hard;
            if (sscanf(value, "%llu:%llu:%llu", &res, &soft, &hard) != 3 || res >= RLIM_NLIMITS) {
                errno = EINVAL;
                die("bad rlimit", value);
            }
            go->lims[res] = (struct rlimit){(rlim_t)soft, (rlim_t)hard};
            go->has_lim[res] = 1;
        } else {
            errno = EINVAL;
            die("bad standby field", value - 1);
        }
    }
    if (argc <= go->direct) {
        errno = EINVAL;
        die("standby", "no program given");
    }
    go->argv = argv;
    go->env = env;
}

/* The job's rlimits, as its own uid: lower only (the worker checks they are). */
static void apply_rlimits(const struct go *go) {
    for (int res = 0; res < RLIM_NLIMITS; res++)
        if (go->has_lim[res] && setrlimit(res, &go->lims[res]) != 0) die("setrlimit", "standby");
}
