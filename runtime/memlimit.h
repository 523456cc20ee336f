/*
** How much memory this process may still take, and who says so: the
** kernel's MemAvailable, lowered by the memory limits of the cgroups the
** process is in. The process's own cgroup is found in /proc/self/cgroup (v2:
** the line "0::/path"; v1: the line of the "memory" controller), its
** hierarchy's mount point in /proc/self/mountinfo; the limit is read at that
** cgroup and at every one above it up to the mount's root, as the kernel
** enforces each (v2 memory.max less memory.current; v1
** memory.limit_in_bytes less memory.usage_in_bytes), each usage less the
** page cache the kernel would reclaim first (inactive_file of memory.stat).
** The tightest counts. A container, a Slurm job or a systemd slice is a
** cgroup below the root, where the root's limit says nothing.
*/
#ifndef MGC_MEMLIMIT_H
#define MGC_MEMLIMIT_H
#include <stddef.h>

/* Where the facts are read from; a NULL field (or a NULL RtMemSources):
   the running process's own. Tests point them at a tree of their own. */
typedef struct RtMemSources {
    const char *cgroup;       /* /proc/self/cgroup */
    const char *mountinfo;    /* /proc/self/mountinfo */
    const char *meminfo;      /* /proc/meminfo */
} RtMemSources;

typedef struct RtMemLimit {
    size_t available;         /* bytes this process may still take; 0 when nothing could be read */
    size_t limit, used;       /* the limiting cgroup's limit and usage in bytes (0, 0 where MemAvailable limits) */
    char where[600];          /* what limits: "cgroup /a/b memory.max", "cgroup /a memory.limit_in_bytes",
                                 "MemAvailable"; "" when unknown */
} RtMemLimit;

/* What limits this process's memory now, into *out. */
void   rt_memory_limit(const RtMemSources *src, RtMemLimit *out);
/* rt_memory_limit's available bytes, for this process. */
size_t rt_memory_available(void);

#endif
