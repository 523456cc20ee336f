/*
** The memory this process may still take (see memlimit.h): MemAvailable and
** the limits of its own cgroup and those above it, v2 and v1.
**
**   /proc/self/cgroup      "0::/user.slice/job.scope"           (v2)
**                          "4:memory:/slurm/uid_0/job_7"        (v1, the memory controller's line)
**   /proc/self/mountinfo   "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw"
**                          "35 31 0:32 /docker/ab /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory"
**
** A mount's root (the fourth field) is the cgroup its mount point shows: a
** container without its own cgroup namespace sees its cgroup's directory
** mounted at /sys/fs/cgroup/memory, so the path /docker/ab/x is found at
** /sys/fs/cgroup/memory/x. Levels above the mount's root cannot be seen.
*/
#include "memlimit.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ML_PATH 4096
#define ML_UNLIMITED (1LL << 60)   /* v1 says "no limit" as 2^63 rounded down to a page */

/* The first number in a file (a line starting with key, when given), or -1
   (a missing file, "max", no such line). */
static long long read_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    long long v = -1;
    size_t klen = key ? strlen(key) : 0;
    while (fgets(line, sizeof line, f)) {
        if (key && (strncmp(line, key, klen) || (line[klen] != ' ' && line[klen] != ':'))) continue;
        char *p = line + klen + (key && line[klen] == ':'), *end;
        long long x = strtoll(p, &end, 10);
        if (end != p && x >= 0) v = x;
        break;
    }
    fclose(f);
    return v;
}

/* One hierarchy with a memory controller: where it is mounted, and the
   process's cgroup in it. */
typedef struct Hierarchy {
    bool v2;
    char mount[ML_PATH];      /* its mount point */
    char root[ML_PATH];       /* the cgroup the mount point shows */
    char path[ML_PATH];       /* the process's cgroup, as /proc/self/cgroup names it */
} Hierarchy;

/* mountinfo's escapes (\040 for a space, \011, \012, \134) undone in place. */
static void unescape(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

/* Whether path is root or below it. */
static bool under(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (!strcmp(root, "/")) return path[0] == '/';
    return !strncmp(path, root, n) && (path[n] == 0 || path[n] == '/');
}

/* The mount of the v2 hierarchy (v2) or of v1's memory controller, from
   mountinfo: one whose root holds the process's cgroup h->path where there
   is one. true when found. */
static bool find_mount(const char *mountinfo, Hierarchy *h)
{
    FILE *f = fopen(mountinfo, "r");
    if (!f) return false;
    char line[3 * ML_PATH];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        char *sep = strstr(line, " - ");
        if (!sep) continue;
        *sep = 0;
        char fstype[64], source[ML_PATH], opts[1024] = "", root[ML_PATH], mnt[ML_PATH];
        if (sscanf(sep + 3, "%63s %4095s %1023s", fstype, source, opts) < 2) continue;
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, mnt) != 2) continue;
        bool memory = false;
        for (char *save = NULL, *tok = strtok_r(opts, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            memory |= !strcmp(tok, "memory");
        if (h->v2 ? strcmp(fstype, "cgroup2") : strcmp(fstype, "cgroup") || !memory) continue;
        unescape(root);
        unescape(mnt);
        if (found && !under(h->path, root)) continue;   /* the first mount that holds the cgroup, else the first */
        snprintf(h->mount, sizeof h->mount, "%s", mnt);
        snprintf(h->root, sizeof h->root, "%s", root);
        found = true;
        if (under(h->path, root)) break;
    }
    fclose(f);
    return found;
}

/* The limit at one cgroup (its directory dir, its name name): lowers *out
   where tighter. */
static void level(const Hierarchy *h, const char *dir, const char *name, RtMemLimit *out)
{
    char file[ML_PATH + 64];
    const char *limit_file = h->v2 ? "memory.max" : "memory.limit_in_bytes";
    snprintf(file, sizeof file, "%s/%s", dir, limit_file);
    long long limit = read_number(file, NULL);
    if (limit < 0 || limit >= ML_UNLIMITED) return;
    snprintf(file, sizeof file, "%s/%s", dir, h->v2 ? "memory.current" : "memory.usage_in_bytes");
    long long used = read_number(file, NULL);
    if (used < 0) used = 0;
    snprintf(file, sizeof file, "%s/memory.stat", dir);
    long long cache = read_number(file, h->v2 ? "inactive_file" : "total_inactive_file");
    if (cache > 0 && cache <= used) used -= cache;
    size_t left = limit > used ? (size_t)(limit - used) : 0;
    if (out->where[0] && left >= out->available) return;
    out->available = left;
    out->limit = (size_t)limit;
    out->used = (size_t)used;
    snprintf(out->where, sizeof out->where, "cgroup %s %s", name, limit_file);
}

/* Every level of h from the process's cgroup up to the mount's root. */
static void walk(const Hierarchy *h, RtMemLimit *out)
{
    char name[ML_PATH], dir[2 * ML_PATH];
    bool root_slash = !strcmp(h->root, "/");
    if (!under(h->path, h->root)) {   /* not below what is mounted: the mount point's own cgroup only */
        level(h, h->mount, h->root, out);
        return;
    }
    snprintf(name, sizeof name, "%s", h->path);
    for (;;) {
        const char *rel = name + (root_slash ? 0 : strlen(h->root));
        snprintf(dir, sizeof dir, "%s%s", h->mount, strcmp(rel, "/") ? rel : "");
        level(h, dir, name, out);
        if (!strcmp(name, h->root)) break;
        char *slash = strrchr(name, '/');
        if (!slash) break;
        if (slash == name) slash[1] = 0;   /* "/a" -> "/" */
        else *slash = 0;
    }
}

void rt_memory_limit(const RtMemSources *src, RtMemLimit *out)
{
    const char *cgroup = src && src->cgroup ? src->cgroup : "/proc/self/cgroup";
    const char *mountinfo = src && src->mountinfo ? src->mountinfo : "/proc/self/mountinfo";
    const char *meminfo = src && src->meminfo ? src->meminfo : "/proc/meminfo";
    memset(out, 0, sizeof *out);
    long long avail = read_number(meminfo, "MemAvailable");
    if (avail >= 0) {
        out->available = (size_t)avail * 1024;   /* kB */
        snprintf(out->where, sizeof out->where, "MemAvailable");
    }
    /* the process's cgroups: v2's line, and v1's memory controller's */
    Hierarchy *h = calloc(2, sizeof *h);
    FILE *f = h ? fopen(cgroup, "r") : NULL;
    char line[ML_PATH + 128];
    bool have[2] = { false, false };
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/') continue;
        bool v2 = c1 == line + 1 && line[0] == '0' && c2 == c1 + 1, memory = false;   /* "0::/path" */
        *c2 = 0;
        for (char *save = NULL, *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            memory |= !strcmp(tok, "memory");
        if (!v2 && !memory) continue;
        Hierarchy *x = &h[v2 ? 0 : 1];
        x->v2 = v2;
        snprintf(x->path, sizeof x->path, "%s", c2 + 1);
        have[v2 ? 0 : 1] = true;
    }
    if (f) fclose(f);
    for (int k = 0; k < 2; k++) {
        if (!have[k]) continue;
        if (!find_mount(mountinfo, &h[k])) {   /* no mountinfo: the usual places */
            snprintf(h[k].mount, sizeof h[k].mount, "%s", k == 0 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
            snprintf(h[k].root, sizeof h[k].root, "/");
        }
        walk(&h[k], out);
    }
    free(h);
}

size_t rt_memory_available(void)
{
    RtMemLimit m;
    rt_memory_limit(NULL, &m);
    return m.available;
}
