// tflaunch's fix for a crash in TensorFlow's profiler (TensorFlow 2.x with libstdc++), loaded by
// the trace hook (sitecustomize.py) into a traced task before TensorFlow, so that this
// definition takes the place of TensorFlow's own (the call goes through the PLT).
//
// The crash: tsl::profiler::TraceMeRecorder::Consume() keeps pointers to "end" events of
// activities that began on another thread (TraceMe::ActivityStart/ActivityEnd, e.g. a
// collective's CompleteParams under MultiWorkerMirroredStrategy) into each thread's
// std::deque<Event>, and pushes those deques into a std::vector<ThreadEvents>. std::deque's
// move constructor is not noexcept in libstdc++, so when that vector grows it *copies* the
// elements and frees the old ones: the kept pointers dangle, and the merge that follows writes
// into freed memory (SIGSEGV in SplitEventTracker::FindStartAndMerge, or SIGABRT "double free
// or corruption"). This is the same vector growth, moving the elements instead: a moved deque
// keeps its events where they are.
//
// The layouts below are TensorFlow's (xla/tsl/profiler/backends/cpu/traceme_recorder.h); the
// hook checks them against the installed TensorFlow's header before building this file.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <new>
#include <string>
#include <utility>

namespace tflaunch_fix {
struct Event {
  std::string name;
  int64_t start_time;
  int64_t end_time;
};
struct ThreadInfo {
  int64_t tid;
  std::string name;
};
struct ThreadEvents {
  ThreadInfo thread;
  std::deque<Event> events;
};
struct Storage {  // std::vector's three pointers (libstdc++)
  ThreadEvents* start;
  ThreadEvents* finish;
  ThreadEvents* end_of_storage;
};
}  // namespace tflaunch_fix

using tflaunch_fix::Storage;
using tflaunch_fix::ThreadEvents;

extern "C" {
__attribute__((visibility("default"))) unsigned long tflaunch_tracemefix_calls;
__attribute__((visibility("default"))) void tflaunch_realloc_insert(
    Storage* v, ThreadEvents* pos, ThreadEvents* value)
    __asm__("_ZNSt6vectorIN3tsl8profiler15TraceMeRecorder12ThreadEventsESaIS3_EE17_M_realloc_insertIJS3_EEEvN9__gnu_cxx17__normal_iteratorIPS3_S5_EEDpOT_");
}

void tflaunch_realloc_insert(Storage* v, ThreadEvents* pos, ThreadEvents* value) {
  __atomic_add_fetch(&tflaunch_tracemefix_calls, 1, __ATOMIC_RELAXED);
  const std::size_t size = v->finish - v->start;
  const std::size_t len = size + (size ? size : 1);
  ThreadEvents* mem = static_cast<ThreadEvents*>(::operator new(len * sizeof(ThreadEvents)));
  new (mem + (pos - v->start)) ThreadEvents(std::move(*value));
  ThreadEvents* out = mem;
  for (ThreadEvents* p = v->start; p != v->finish; ++p, ++out) {
    if (p == pos) ++out;
    new (out) ThreadEvents(std::move(*p));  // moves the deque: its events stay where they are
    p->~ThreadEvents();
  }
  ::operator delete(v->start);
  v->start = mem;
  v->finish = mem + size + 1;
  v->end_of_storage = mem + len;
}

#ifdef TFLAUNCH_CHECK_LAYOUT  // the hook's first pass: -fsyntax-only against TensorFlow's header
#include <vector>

#include "xla/tsl/profiler/backends/cpu/traceme_recorder.h"

namespace tflaunch_fix {
using Real = tsl::profiler::TraceMeRecorder;
static_assert(sizeof(Real::Event) == sizeof(Event) &&
                  offsetof(Real::Event, name) == offsetof(Event, name) &&
                  offsetof(Real::Event, start_time) == offsetof(Event, start_time) &&
                  offsetof(Real::Event, end_time) == offsetof(Event, end_time),
              "TraceMeRecorder::Event");
static_assert(sizeof(Real::ThreadInfo) == sizeof(ThreadInfo) &&
                  offsetof(Real::ThreadInfo, name) == offsetof(ThreadInfo, name),
              "TraceMeRecorder::ThreadInfo");
static_assert(sizeof(Real::ThreadEvents) == sizeof(ThreadEvents) &&
                  offsetof(Real::ThreadEvents, events) == offsetof(ThreadEvents, events),
              "TraceMeRecorder::ThreadEvents");
static_assert(sizeof(std::vector<Real::ThreadEvents>) == sizeof(Storage), "std::vector");
}  // namespace tflaunch_fix
#endif
