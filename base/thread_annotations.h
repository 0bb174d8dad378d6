#pragma once
// Lock annotations: which mutex guards which data, and which functions take, drop or need a
// mutex. Clang checks them with -Wthread-safety (tests/base: ThreadSafetyTest runs that check
// over the annotated files); under GCC every macro expands to nothing.
//
//   class Queue {
//    public:
//     void push(int v) TESSEL_EXCLUDES(mutex_) {
//       MutexLock lock(mutex_);
//       push_locked(v);
//     }
//    private:
//     void push_locked(int v) TESSEL_REQUIRES(mutex_) { items_.push_back(v); }
//     Mutex mutex_;
//     std::vector<int> items_ TESSEL_GUARDED_BY(mutex_);
//   };
//
// A lambda is checked as a function of its own, without its caller's locks: one that reads
// guarded data under the caller's lock says so with TESSEL_REQUIRES after its parameter list.

#if defined(__clang__)
#define TESSEL_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define TESSEL_THREAD_ANNOTATION_(x)
#endif

// On a class: its objects are locks (Mutex). `name` appears in the diagnostics ("mutex").
#define TESSEL_CAPABILITY(name) TESSEL_THREAD_ANNOTATION_(capability(name))
// On a class: an object of it holds a lock from its construction to its destruction
// (MutexLock); its lock()/unlock() members may drop and retake it in between.
#define TESSEL_SCOPED_CAPABILITY TESSEL_THREAD_ANNOTATION_(scoped_lockable)

// On a data member: read or written only with lock `x` held.
#define TESSEL_GUARDED_BY(x) TESSEL_THREAD_ANNOTATION_(guarded_by(x))
// On a pointer member: what it points at is read or written only with lock `x` held (the
// pointer itself is not guarded).
#define TESSEL_PT_GUARDED_BY(x) TESSEL_THREAD_ANNOTATION_(pt_guarded_by(x))

// On a lock member: the order in which locks are taken when both are held.
#define TESSEL_ACQUIRED_BEFORE(...) TESSEL_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define TESSEL_ACQUIRED_AFTER(...) TESSEL_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))

// On a function: the caller must hold the locks (exclusively, or at least shared).
#define TESSEL_REQUIRES(...) TESSEL_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define TESSEL_REQUIRES_SHARED(...) \
  TESSEL_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// On a function: the caller must not hold the locks (the function takes them itself).
#define TESSEL_EXCLUDES(...) TESSEL_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// On a function: it takes the locks and returns with them held. With no argument on a member
// of a capability class, the lock is the object itself.
#define TESSEL_ACQUIRE(...) TESSEL_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define TESSEL_ACQUIRE_SHARED(...) TESSEL_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
// On a function: it takes the locks only when it returns `result` (the first argument).
#define TESSEL_TRY_ACQUIRE(...) TESSEL_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
// On a function: the caller holds the locks on entry; they are free on return.
#define TESSEL_RELEASE(...) TESSEL_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TESSEL_RELEASE_SHARED(...) TESSEL_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))

// On a function: it checks at run time that the lock is held (from here on the analysis
// assumes it is).
#define TESSEL_ASSERT_CAPABILITY(x) TESSEL_THREAD_ANNOTATION_(assert_capability(x))
// On a function: it returns a reference to lock `x` (an accessor for a private mutex).
#define TESSEL_RETURN_CAPABILITY(x) TESSEL_THREAD_ANNOTATION_(lock_returned(x))

// On a function: the analysis skips its body. For correct locking it cannot follow; say why in
// a comment beside it.
#define TESSEL_NO_THREAD_SAFETY_ANALYSIS TESSEL_THREAD_ANNOTATION_(no_thread_safety_analysis)
