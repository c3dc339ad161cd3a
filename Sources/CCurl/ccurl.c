#define _GNU_SOURCE /* memmem */
#include "ccurl.h"

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Function pointers resolved from libcurl.so.4 by ccurl_load. */
static CURLcode (*p_global_init)(long);
static char *(*p_version)(void);
static const char *(*p_easy_strerror)(CURLcode);
static const char *(*p_multi_strerror)(CURLMcode);
static CURL *(*p_easy_init)(void);
static void (*p_easy_cleanup)(CURL *);
static void (*p_easy_reset)(CURL *);
static CURLcode (*p_easy_setopt)(CURL *, CURLoption, ...);
static CURLcode (*p_easy_getinfo)(CURL *, CURLINFO, ...);
static struct curl_slist *(*p_slist_append)(struct curl_slist *, const char *);
static void (*p_slist_free_all)(struct curl_slist *);
static CURLM *(*p_multi_init)(void);
static CURLMcode (*p_multi_cleanup)(CURLM *);
static CURLMcode (*p_multi_setopt)(CURLM *, CURLMoption, ...);
static CURLMcode (*p_multi_add_handle)(CURLM *, CURL *);
static CURLMcode (*p_multi_remove_handle)(CURLM *, CURL *);
static CURLMcode (*p_multi_perform)(CURLM *, int *);
static CURLMcode (*p_multi_poll)(CURLM *, struct curl_waitfd *, unsigned int, int, int *);
static CURLMcode (*p_multi_wakeup)(CURLM *);
static CURLMsg *(*p_multi_info_read)(CURLM *, int *);
static curl_mime *(*p_mime_init)(CURL *);
static void (*p_mime_free)(curl_mime *);
static curl_mimepart *(*p_mime_addpart)(curl_mime *);
static CURLcode (*p_mime_name)(curl_mimepart *, const char *);
static CURLcode (*p_mime_data)(curl_mimepart *, const char *, size_t);
static CURLcode (*p_mime_filedata)(curl_mimepart *, const char *);
static CURLcode (*p_mime_filename)(curl_mimepart *, const char *);
static CURLcode (*p_mime_type)(curl_mimepart *, const char *);
static CURLU *(*p_url)(void);
static void (*p_url_cleanup)(CURLU *);
static CURLUcode (*p_url_set)(CURLU *, CURLUPart, const char *, unsigned int);
static CURLUcode (*p_url_get)(const CURLU *, CURLUPart, char **, unsigned int);
static void (*p_free)(void *);

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int load_state; /* 0 not tried, 1 loaded, -1 failed */
static char load_error[256];

#define RESOLVE(ptr, name)                                                        \
    do {                                                                          \
        *(void **)(&(ptr)) = dlsym(lib, name);                                    \
        if (!(ptr)) {                                                             \
            snprintf(load_error, sizeof load_error, "libcurl.so.4 lacks %s", name); \
            return -1;                                                            \
        }                                                                         \
    } while (0)

static int load_locked(void) {
    /* RTLD_LOCAL: libcurl's symbols stay out of the global namespace. RTLD_LAZY: only
       what libcurl calls gets bound (binding its many libraries up front cost 1.5 ms a run). */
    void *lib = dlopen("libcurl.so.4", RTLD_LAZY | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_error, sizeof load_error, "cannot load libcurl.so.4: %s",
                 why ? why : "unknown error");
        return -1;
    }
    RESOLVE(p_global_init, "curl_global_init");
    RESOLVE(p_version, "curl_version");
    RESOLVE(p_easy_strerror, "curl_easy_strerror");
    RESOLVE(p_multi_strerror, "curl_multi_strerror");
    RESOLVE(p_easy_init, "curl_easy_init");
    RESOLVE(p_easy_cleanup, "curl_easy_cleanup");
    RESOLVE(p_easy_reset, "curl_easy_reset");
    RESOLVE(p_easy_setopt, "curl_easy_setopt");
    RESOLVE(p_easy_getinfo, "curl_easy_getinfo");
    RESOLVE(p_slist_append, "curl_slist_append");
    RESOLVE(p_slist_free_all, "curl_slist_free_all");
    RESOLVE(p_multi_init, "curl_multi_init");
    RESOLVE(p_multi_cleanup, "curl_multi_cleanup");
    RESOLVE(p_multi_setopt, "curl_multi_setopt");
    RESOLVE(p_multi_add_handle, "curl_multi_add_handle");
    RESOLVE(p_multi_remove_handle, "curl_multi_remove_handle");
    RESOLVE(p_multi_perform, "curl_multi_perform");
    RESOLVE(p_multi_poll, "curl_multi_poll");       /* 7.66+ */
    RESOLVE(p_multi_wakeup, "curl_multi_wakeup");   /* 7.68+ */
    RESOLVE(p_multi_info_read, "curl_multi_info_read");
    RESOLVE(p_mime_init, "curl_mime_init");
    RESOLVE(p_mime_free, "curl_mime_free");
    RESOLVE(p_mime_addpart, "curl_mime_addpart");
    RESOLVE(p_mime_name, "curl_mime_name");
    RESOLVE(p_mime_data, "curl_mime_data");
    RESOLVE(p_mime_filedata, "curl_mime_filedata");
    RESOLVE(p_mime_filename, "curl_mime_filename");
    RESOLVE(p_mime_type, "curl_mime_type");
    RESOLVE(p_url, "curl_url");                     /* 7.62+ */
    RESOLVE(p_url_cleanup, "curl_url_cleanup");
    RESOLVE(p_url_set, "curl_url_set");
    RESOLVE(p_url_get, "curl_url_get");
    RESOLVE(p_free, "curl_free");
    /* Once per process, before any transfer (curl_global_init is not thread-safe). The
       library stays loaded. */
    CURLcode rc = p_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) {
        snprintf(load_error, sizeof load_error, "curl_global_init failed: %s",
                 p_easy_strerror(rc));
        return -1;
    }
    return 0;
}

int ccurl_load(char *err, size_t errlen) {
    pthread_mutex_lock(&load_lock);
    if (load_state == 0) {
        load_state = load_locked() == 0 ? 1 : -1;
    }
    int ok = load_state == 1;
    if (!ok && err && errlen > 0) {
        snprintf(err, errlen, "%s", load_error);
    }
    pthread_mutex_unlock(&load_lock);
    return ok ? 0 : -1;
}

const char *ccurl_version(void) { return p_version(); }
const char *ccurl_easy_strerror(CURLcode code) { return p_easy_strerror(code); }
const char *ccurl_multi_strerror(CURLMcode code) { return p_multi_strerror(code); }

CURL *ccurl_easy_init(void) { return p_easy_init(); }
void ccurl_easy_cleanup(CURL *easy) { p_easy_cleanup(easy); }
void ccurl_easy_reset(CURL *easy) { p_easy_reset(easy); }

CURLcode ccurl_setopt_long(CURL *easy, CURLoption option, long value) {
    return p_easy_setopt(easy, option, value);
}
CURLcode ccurl_setopt_off_t(CURL *easy, CURLoption option, curl_off_t value) {
    return p_easy_setopt(easy, option, value);
}
CURLcode ccurl_setopt_str(CURL *easy, CURLoption option, const char *value) {
    return p_easy_setopt(easy, option, value);
}
CURLcode ccurl_setopt_aws_sigv4(CURL *easy, const char *provider, const char *key_id, const char *secret) {
    CURLcode rc = p_easy_setopt(easy, CURLOPT_AWS_SIGV4, provider);
    if (rc == CURLE_OK) rc = p_easy_setopt(easy, CURLOPT_USERNAME, key_id);
    if (rc == CURLE_OK) rc = p_easy_setopt(easy, CURLOPT_PASSWORD, secret);
    return rc;
}
static int capture_signature(CURL *easy, curl_infotype type, char *data, size_t size, void *user) {
    (void)easy;
    if (type != CURLINFO_HEADER_OUT) return 0;
    ccurl_signature *out = user;
    const char *end = data + size;
    for (const char *line = data; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if (eol - line > 14 && strncasecmp(line, "authorization:", 14) == 0) {
            const char *sig = memmem(line, (size_t)(eol - line), "Signature=", 10);
            if (sig) {
                sig += 10;
                size_t n = 0;
                while (sig + n < eol && isxdigit((unsigned char)sig[n]) && n < sizeof out->value - 1) n++;
                memcpy(out->value, sig, n);
                out->value[n] = 0;
                out->length = n;
            }
        }
        line = eol + 1;
    }
    return 0;
}
CURLcode ccurl_capture_signature(CURL *easy, ccurl_signature *out) {
    CURLcode rc = p_easy_setopt(easy, CURLOPT_DEBUGFUNCTION, capture_signature);
    if (rc == CURLE_OK) rc = p_easy_setopt(easy, CURLOPT_DEBUGDATA, out);
    if (rc == CURLE_OK) rc = p_easy_setopt(easy, CURLOPT_VERBOSE, 1L);
    return rc;
}
static int one_request_per_answer(void *user, char *primary_ip, char *local_ip, int primary_port, int local_port) {
    (void)primary_ip, (void)local_ip, (void)primary_port, (void)local_port;
    int *unanswered = user;
    if (*unanswered) {
        *unanswered = 2;
        return CURL_PREREQFUNC_ABORT;
    }
    *unanswered = 1;
    return CURL_PREREQFUNC_OK;
}
CURLcode ccurl_one_request_per_answer(CURL *easy, int *unanswered) {
    CURLcode rc = p_easy_setopt(easy, CURLOPT_PREREQFUNCTION, one_request_per_answer);
    if (rc == CURLE_OK) rc = p_easy_setopt(easy, CURLOPT_PREREQDATA, unanswered);
    return rc;
}
CURLcode ccurl_setopt_ptr(CURL *easy, CURLoption option, void *value) {
    return p_easy_setopt(easy, option, value);
}
CURLcode ccurl_setopt_slist(CURL *easy, CURLoption option, struct curl_slist *list) {
    return p_easy_setopt(easy, option, list);
}
CURLcode ccurl_setopt_mime(CURL *easy, curl_mime *mime) {
    return p_easy_setopt(easy, CURLOPT_MIMEPOST, mime);
}
CURLcode ccurl_setopt_write_function(CURL *easy, CURLoption option, curl_write_callback fn) {
    return p_easy_setopt(easy, option, fn);
}
CURLcode ccurl_setopt_read_function(CURL *easy, curl_read_callback fn) {
    return p_easy_setopt(easy, CURLOPT_READFUNCTION, fn);
}
CURLcode ccurl_setopt_seek_function(CURL *easy, curl_seek_callback fn) {
    return p_easy_setopt(easy, CURLOPT_SEEKFUNCTION, fn);
}
CURLcode ccurl_setopt_xferinfo_function(CURL *easy, curl_xferinfo_callback fn) {
    return p_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, fn);
}

CURLcode ccurl_getinfo_long(CURL *easy, CURLINFO info, long *out) {
    return p_easy_getinfo(easy, info, out);
}
CURLcode ccurl_getinfo_double(CURL *easy, CURLINFO info, double *out) {
    return p_easy_getinfo(easy, info, out);
}
CURLcode ccurl_getinfo_off_t(CURL *easy, CURLINFO info, curl_off_t *out) {
    return p_easy_getinfo(easy, info, out);
}
CURLcode ccurl_getinfo_str(CURL *easy, CURLINFO info, const char **out) {
    char *value = NULL;
    CURLcode rc = p_easy_getinfo(easy, info, &value);
    *out = value;
    return rc;
}
CURLcode ccurl_getinfo_ptr(CURL *easy, CURLINFO info, void **out) {
    return p_easy_getinfo(easy, info, out);
}

struct curl_slist *ccurl_slist_append(struct curl_slist *list, const char *line) {
    return p_slist_append(list, line);
}
void ccurl_slist_free_all(struct curl_slist *list) { p_slist_free_all(list); }

CURLM *ccurl_multi_init(void) { return p_multi_init(); }
CURLMcode ccurl_multi_cleanup(CURLM *multi) { return p_multi_cleanup(multi); }
CURLMcode ccurl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return p_multi_setopt(multi, option, value);
}
CURLMcode ccurl_multi_add_handle(CURLM *multi, CURL *easy) {
    return p_multi_add_handle(multi, easy);
}
CURLMcode ccurl_multi_remove_handle(CURLM *multi, CURL *easy) {
    return p_multi_remove_handle(multi, easy);
}
CURLMcode ccurl_multi_perform(CURLM *multi, int *running) {
    return p_multi_perform(multi, running);
}
CURLMcode ccurl_multi_poll(CURLM *multi, int timeout_ms, int *numfds) {
    return p_multi_poll(multi, NULL, 0, timeout_ms, numfds);
}
CURLMcode ccurl_multi_wakeup(CURLM *multi) { return p_multi_wakeup(multi); }

int ccurl_multi_next_done(CURLM *multi, CURL **easy, CURLcode *result) {
    int left = 0;
    CURLMsg *msg;
    while ((msg = p_multi_info_read(multi, &left)) != NULL) {
        if (msg->msg == CURLMSG_DONE) {
            *easy = msg->easy_handle;
            *result = msg->data.result;
            return 1;
        }
    }
    return 0;
}

curl_mime *ccurl_mime_init(CURL *easy) { return p_mime_init(easy); }
void ccurl_mime_free(curl_mime *mime) { p_mime_free(mime); }
curl_mimepart *ccurl_mime_addpart(curl_mime *mime) { return p_mime_addpart(mime); }
CURLcode ccurl_mime_name(curl_mimepart *part, const char *name) {
    return p_mime_name(part, name);
}
CURLcode ccurl_mime_data(curl_mimepart *part, const char *data, size_t length) {
    return p_mime_data(part, data, length);
}
CURLcode ccurl_mime_filedata(curl_mimepart *part, const char *path) {
    return p_mime_filedata(part, path);
}
CURLcode ccurl_mime_filename(curl_mimepart *part, const char *filename) {
    return p_mime_filename(part, filename);
}
CURLcode ccurl_mime_type(curl_mimepart *part, const char *type) {
    return p_mime_type(part, type);
}

int ccurl_redirect_origin(const char *base, const char *location, char *out, size_t size) {
    CURLU *url = p_url();
    if (!url) return -1;
    char *scheme = NULL, *host = NULL, *port = NULL;
    /* The flags libcurl's own redirect resolution uses, so both read the Location alike. */
    unsigned int flags = CURLU_NON_SUPPORT_SCHEME | CURLU_URLENCODE | CURLU_ALLOW_SPACE;
    int rc = -1;
    if (p_url_set(url, CURLUPART_URL, base, CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
        p_url_set(url, CURLUPART_URL, location, flags) == CURLUE_OK &&
        p_url_get(url, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        p_url_get(url, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        p_url_get(url, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        int n = snprintf(out, size, "%s://%s:%s", scheme, host, port);
        rc = n >= 0 && (size_t)n < size ? 0 : -1;
    }
    p_free(scheme);
    p_free(host);
    p_free(port);
    p_url_cleanup(url);
    return rc;
}
