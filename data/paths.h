/*
** Files mgc writes for the user (checkpoints, --dump, --log): where a write
** lands, and whether it can, checked before any work is done, so that a typo
** in a path costs a second, not an epoch.
*/
#ifndef MGC_PATHS_H
#define MGC_PATHS_H
#include <stddef.h>
#include <sys/types.h>

/* The file a write to path lands in: path with the symbolic links of its
   last component followed (a link to a link, ...; the target need not
   exist), into out. 0, or -1 with errno (ELOOP: a cycle of links). */
int rt_path_target(const char *path, char *out, size_t size);
/* path can be replaced by a new file renamed into place (a checkpoint): its
   target is a regular file or nothing yet, in a directory this user can
   write. 0, or -1 with err ("PATH: why; what to do"). */
int rt_check_replaceable(const char *path, char *err, size_t err_size);
/* path can be opened to write or append (a log; a FIFO or /dev/stdout will
   do). 0, or -1 with err. */
int rt_check_appendable(const char *path, char *err, size_t err_size);
/* A file's kind from its stat mode, for messages: "a directory", "a FIFO",
   "a character device", ... */
const char *rt_file_kind(mode_t mode);

#endif
