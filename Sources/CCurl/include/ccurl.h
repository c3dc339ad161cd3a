#ifndef OUTBOX_CCURL_H
#define OUTBOX_CCURL_H

/*
 * Typed, non-variadic access to libcurl for Swift.
 *
 * <curl/curl.h> is included for its types and constants only: nothing here links
 * libcurl. `ccurl_load` opens libcurl.so.4 with dlopen at run time, so processes that
 * never send HTTP (`outbox enqueue`) do not pay for loading it (about 7 ms per start).
 * Every other function requires a successful `ccurl_load` first.
 */

#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads libcurl and calls curl_global_init once per process. Returns 0 on success,
   otherwise -1 with a message in `err`. Safe to call from several threads and again. */
int ccurl_load(char *err, size_t errlen);

/* curl_version(): "libcurl/7.88.1 OpenSSL/3.0.x ..." */
const char *ccurl_version(void);
const char *ccurl_easy_strerror(CURLcode code);
const char *ccurl_multi_strerror(CURLMcode code);

CURL *ccurl_easy_init(void);
void ccurl_easy_cleanup(CURL *easy);
/* Every option back to its default; the handle keeps its connection and caches. */
void ccurl_easy_reset(CURL *easy);

CURLcode ccurl_setopt_long(CURL *easy, CURLoption option, long value);
CURLcode ccurl_setopt_off_t(CURL *easy, CURLoption option, curl_off_t value);
CURLcode ccurl_setopt_str(CURL *easy, CURLoption option, const char *value);
CURLcode ccurl_setopt_ptr(CURL *easy, CURLoption option, void *value);
CURLcode ccurl_setopt_slist(CURL *easy, CURLoption option, struct curl_slist *list);
CURLcode ccurl_setopt_mime(CURL *easy, curl_mime *mime); /* CURLOPT_MIMEPOST */
/* AWS Signature V4: CURLOPT_AWS_SIGV4 ("aws:amz:REGION:SERVICE") with the key id and secret
   as CURLOPT_USERNAME / CURLOPT_PASSWORD (USERPWD's "user:password" split at the first
   colon, without building that string). */
CURLcode ccurl_setopt_aws_sigv4(CURL *easy, const char *provider, const char *key_id, const char *secret);
/* The Signature= value of the Authorization header libcurl computed when it signed, kept so
   that a server quoting it back (S3 error bodies do) can be masked. */
typedef struct ccurl_signature {
    char value[128];
    size_t length;
} ccurl_signature;
/* Records the signature of each request `easy` sends into `out` (a debug callback that reads
   only the outgoing header block; CURLOPT_VERBOSE is on, its text goes to the callback). */
CURLcode ccurl_capture_signature(CURL *easy, ccurl_signature *out);
/* Refuses a request libcurl would send while one it sent has no answer yet: its silent re-send
   on a new connection when a reused one closed before answering, which no attempt would show.
   `*unanswered` is set to 1 as a request goes, to 2 when a second one is refused (the transfer
   then ends with CURLE_ABORTED_BY_CALLBACK); the header callback sets it to 0 as an answer
   comes. Needs libcurl 7.80 (CURLOPT_PREREQFUNCTION). */
CURLcode ccurl_one_request_per_answer(CURL *easy, int *unanswered);
/* WRITEFUNCTION or HEADERFUNCTION (same signature). */
CURLcode ccurl_setopt_write_function(CURL *easy, CURLoption option, curl_write_callback fn);
CURLcode ccurl_setopt_read_function(CURL *easy, curl_read_callback fn);
CURLcode ccurl_setopt_seek_function(CURL *easy, curl_seek_callback fn);
CURLcode ccurl_setopt_xferinfo_function(CURL *easy, curl_xferinfo_callback fn);

CURLcode ccurl_getinfo_long(CURL *easy, CURLINFO info, long *out);
CURLcode ccurl_getinfo_double(CURL *easy, CURLINFO info, double *out);
CURLcode ccurl_getinfo_off_t(CURL *easy, CURLINFO info, curl_off_t *out);
/* The string belongs to the easy handle: copy it before curl_easy_cleanup. */
CURLcode ccurl_getinfo_str(CURL *easy, CURLINFO info, const char **out);
CURLcode ccurl_getinfo_ptr(CURL *easy, CURLINFO info, void **out);

struct curl_slist *ccurl_slist_append(struct curl_slist *list, const char *line);
void ccurl_slist_free_all(struct curl_slist *list);

CURLM *ccurl_multi_init(void);
CURLMcode ccurl_multi_cleanup(CURLM *multi);
CURLMcode ccurl_multi_setopt_long(CURLM *multi, CURLMoption option, long value);
CURLMcode ccurl_multi_add_handle(CURLM *multi, CURL *easy);
CURLMcode ccurl_multi_remove_handle(CURLM *multi, CURL *easy);
CURLMcode ccurl_multi_perform(CURLM *multi, int *running);
CURLMcode ccurl_multi_poll(CURLM *multi, int timeout_ms, int *numfds);
CURLMcode ccurl_multi_wakeup(CURLM *multi);
/* Next CURLMSG_DONE message: returns 1 and fills `easy` and `result`, or 0 when none
   is left (CURLMsg holds a union Swift reads awkwardly). */
int ccurl_multi_next_done(CURLM *multi, CURL **easy, CURLcode *result);

curl_mime *ccurl_mime_init(CURL *easy);
void ccurl_mime_free(curl_mime *mime);
curl_mimepart *ccurl_mime_addpart(curl_mime *mime);
CURLcode ccurl_mime_name(curl_mimepart *part, const char *name);
CURLcode ccurl_mime_data(curl_mimepart *part, const char *data, size_t length);
CURLcode ccurl_mime_filedata(curl_mimepart *part, const char *path);
CURLcode ccurl_mime_filename(curl_mimepart *part, const char *filename);
CURLcode ccurl_mime_type(curl_mimepart *part, const char *type);

/* Where a redirect to `location` from `base` leads, resolved by libcurl's URL parser (the
   one its redirects use): "scheme://host:port" with the scheme's port filled in, written
   to `out`. Returns 0, or -1 when libcurl cannot read either URL. */
int ccurl_redirect_origin(const char *base, const char *location, char *out, size_t size);

#ifdef __cplusplus
}
#endif

#endif
