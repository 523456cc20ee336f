/*
** Files mgc writes for the user: where a write lands, and whether it can
** (see paths.h).
*/
#include "paths.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rt_path_target(const char *path, char *out, size_t size)
{
    char cur[PATH_MAX];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(cur, &st) || !S_ISLNK(st.st_mode)) {
            snprintf(out, size, "%s", cur);
            return 0;
        }
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) return -1;
        link[n] = 0;
        const char *slash = strrchr(cur, '/');
        char next[2 * PATH_MAX + 2];
        if (link[0] == '/' || !slash) snprintf(next, sizeof next, "%s", link);
        else snprintf(next, sizeof next, "%.*s/%s", (int)(slash - cur), cur, link);   /* relative to the link's directory */
        if (strlen(next) >= sizeof cur) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(cur, next, strlen(next) + 1);
    }
    errno = ELOOP;
    return -1;
}

const char *rt_file_kind(mode_t m)
{
    return S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "of an unknown kind";
}

/* The directory of target can take new files: 0, or -1 with err. */
static int dir_writable(const char *path, const char *target, char *err, size_t err_size)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(target, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == target) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - target), target);
    struct stat st;
    if (stat(dir, &st)) {
        snprintf(err, err_size, "%s: the directory %s %s; create it, or write elsewhere", path, dir,
                 errno == ENOENT ? "does not exist" : strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_size, "%s: %s is not a directory", path, dir);
        return -1;
    }
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS)) {
        snprintf(err, err_size, "%s: cannot write into the directory %s (%s); write elsewhere", path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

int rt_check_replaceable(const char *path, char *err, size_t err_size)
{
    char target[PATH_MAX];
    if (rt_path_target(path, target, sizeof target)) {
        snprintf(err, err_size, "%s: cannot follow its symbolic links: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (!stat(target, &st) && !S_ISREG(st.st_mode)) {
        snprintf(err, err_size, "%s%s%s is %s: mgc writes a new file and renames it into place, which would replace it; "
                 "name a regular file", path, strcmp(path, target) ? " -> " : "", strcmp(path, target) ? target : "",
                 rt_file_kind(st.st_mode));
        return -1;
    }
    return dir_writable(path, target, err, err_size);
}

int rt_check_appendable(const char *path, char *err, size_t err_size)
{
    struct stat st;
    if (!stat(path, &st)) {
        if (S_ISDIR(st.st_mode)) {
            snprintf(err, err_size, "%s: is a directory; name a file", path);
            return -1;
        }
        if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS)) {
            snprintf(err, err_size, "%s: cannot write it (%s)", path, strerror(errno));
            return -1;
        }
        return 0;
    }
    char target[PATH_MAX];
    if (rt_path_target(path, target, sizeof target)) {
        snprintf(err, err_size, "%s: cannot follow its symbolic links: %s", path, strerror(errno));
        return -1;
    }
    return dir_writable(path, target, err, err_size);
}
