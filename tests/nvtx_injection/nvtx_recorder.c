/* An NVTX injection library for tests: records every range push/pop to a file.
 *
 * Loaded by NVTX when NVTX_INJECTION64_PATH points at the built .so. It fills the CORE and
 * CORE2 callback tables, maps registered-string and domain handles back to their text (the
 * `nvtx` Python package sends NVTX_MESSAGE_TYPE_REGISTERED messages), and appends one line
 * per event to $PERFHOOKS_NVTX_LOG:  push<TAB>domain<TAB>message  or  pop<TAB>domain
 */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HANDLES 65536

static FILE *log_file;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *strings[MAX_HANDLES];
static int string_count;
static char *domains[MAX_HANDLES];
static int domain_count;

static intptr_t remember(char **table, int *count, const char *text) {
    pthread_mutex_lock(&lock);
    intptr_t handle = 0;
    if (*count < MAX_HANDLES) {
        table[*count] = strdup(text ? text : "");
        handle = ++*count; /* handles start at 1: 0 is the null handle */
    }
    pthread_mutex_unlock(&lock);
    return handle;
}

static const char *lookup(char **table, int count, intptr_t handle, const char *fallback) {
    return (handle >= 1 && handle <= count) ? table[handle - 1] : fallback;
}

static const char *message_of(const nvtxEventAttributes_t *attributes) {
    if (!attributes) return "";
    switch (attributes->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
        return attributes->message.ascii ? attributes->message.ascii : "";
    case NVTX_MESSAGE_TYPE_REGISTERED:
        return lookup(strings, string_count, (intptr_t)attributes->message.registered, "<unregistered>");
    default:
        return "<non-ascii>";
    }
}

static void record(const char *kind, const char *domain, const char *message) {
    pthread_mutex_lock(&lock);
    if (log_file) {
        fprintf(log_file, "%s\t%s\t%s\n", kind, domain, message);
        fflush(log_file);
    }
    pthread_mutex_unlock(&lock);
}

static const char *domain_of(nvtxDomainHandle_t domain) {
    return lookup(domains, domain_count, (intptr_t)domain, "NVTX");
}

static nvtxDomainHandle_t domain_create(const char *name) {
    return (nvtxDomainHandle_t)remember(domains, &domain_count, name);
}

static nvtxStringHandle_t register_string(nvtxDomainHandle_t domain, const char *text) {
    (void)domain;
    return (nvtxStringHandle_t)remember(strings, &string_count, text);
}

static int domain_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attributes) {
    record("push", domain_of(domain), message_of(attributes));
    return 0;
}

static int domain_pop(nvtxDomainHandle_t domain) {
    record("pop", domain_of(domain), "");
    return 0;
}

static int push_a(const char *message) {
    record("push", "NVTX", message ? message : "");
    return 0;
}

static int push_ex(const nvtxEventAttributes_t *attributes) {
    record("push", "NVTX", message_of(attributes));
    return 0;
}

static int pop(void) {
    record("pop", "NVTX", "");
    return 0;
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    const NvtxExportTableCallbacks *callbacks =
        (const NvtxExportTableCallbacks *)get_export_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable core = NULL, core2 = NULL;
    unsigned int core_size = 0, core2_size = 0;
    const char *path = getenv("PERFHOOKS_NVTX_LOG");

    if (!callbacks || !path) return 0;
    if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_size)) return 0;
    if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_size)) return 0;
    if (core_size < NVTX_CBID_CORE_RangePop || core2_size < NVTX_CBID_CORE2_DomainCreateA) return 0;
    log_file = fopen(path, "a");
    if (!log_file) return 0;

    *core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push_a;
    *core[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)push_ex;
    *core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    *core2[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)domain_push;
    *core2[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)domain_pop;
    *core2[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)register_string;
    *core2[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
    return 1;
}
