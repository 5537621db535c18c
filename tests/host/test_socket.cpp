// The worker's socket: where it lives, the checks of its directory, stale and squatted paths, and the door:
// who is admitted (credentials, one host at a time), who is refused and why, observers.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/host/door_client.hpp"
#include "lib/host/host_door.hpp"
#include "lib/host/listener.hpp"
#include "lib/host/session_areas.hpp"
#include "lib/host/socket_io.hpp"
#include "lib/host/socket_path.hpp"

namespace dspark::host {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint32_t kNobody = 65534;  // nobody:nogroup on Debian
constexpr uint32_t kNoUser = 12345;  // a uid without a passwd entry: a member of no group

ModelDescription test_model() {
  ModelDescription m{};
  m.vocab_size = 100;
  m.hidden = 8;
  m.taps = 1;
  m.row_bytes = 16;
  m.block_size = 4;
  m.window = 16;
  m.slots = 2;
  m.max_batch = 2;
  m.max_context_rows = 4;
  m.tp = 1;
  m.max_model_len = 64;
  return m;
}

// A fresh directory name per test (not created: prepare_socket_dir / Listener make it).
class SocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    dir_ = fmt::format("/tmp/dspark-test-socket-{}-{}", getpid(), n++);
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path() const { return dir_ + "/w.sock"; }
  std::string listener_error(const std::string& p, std::optional<uint32_t> group = std::nullopt) {
    try {
      Listener l(p, group);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

// Runs `body` in a forked child that first becomes uid/gid; returns the text it reported. The child is forked
// before the caller starts any thread (setup() runs after the fork, in the parent).
std::string as_user(uint32_t uid, uint32_t gid, const std::function<void()>& setup,
                    const std::function<std::string()>& body) {
  int go[2], out[2];
  if (pipe(go) != 0 || pipe(out) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    char b = 0;
    if (read(go[0], &b, 1) != 1) _exit(2);
    const gid_t g = gid;
    if (setgroups(1, &g) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(3);
    const std::string said = body();
    if (write(out[1], said.data(), said.size()) < 0) _exit(4);
    _exit(0);
  }
  setup();
  const char b = 1;
  (void)!write(go[1], &b, 1);
  close(out[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) said.append(buf, static_cast<size_t>(n));
  int status = 0;
  waitpid(child, &status, 0);
  for (int fd : {go[0], go[1], out[0]}) close(fd);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) said += fmt::format(" (child status {})", status);
  return said;
}

std::string kind_name(DoorAnswer::Kind k) {
  static const char* names[] = {"no_worker", "not_ready", "wrong_owner", "refused", "accepted"};
  return names[static_cast<int>(k)];
}

TEST(SocketPath, NamesDirectoriesAndFullPaths) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = xdg ? xdg : "";
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(default_socket_dir(), fmt::format("/tmp/dspark-{}", geteuid()));
  EXPECT_EQ(socket_path("/dspark-0"), fmt::format("/tmp/dspark-{}/dspark-0.sock", geteuid()));
  EXPECT_EQ(socket_path("tiny"), fmt::format("/tmp/dspark-{}/tiny.sock", geteuid()));
  setenv("XDG_RUNTIME_DIR", "/run/user/42", 1);
  EXPECT_EQ(socket_path("/tiny"), "/run/user/42/dspark/tiny.sock");
  EXPECT_EQ(socket_path("/tiny", "/srv/dspark"), "/srv/dspark/tiny.sock");
  EXPECT_EQ(socket_path("/run/dspark/w.sock", "/srv/dspark"), "/run/dspark/w.sock");
  if (saved.empty())
    unsetenv("XDG_RUNTIME_DIR");
  else
    setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
  EXPECT_THROW(socket_path(""), Error);
  EXPECT_THROW(socket_path("/"), Error);
  EXPECT_THROW(socket_path("relative/w.sock"), Error);
  try {
    socket_path("/" + std::string(200, 'x'));
    FAIL() << "a name too long for a socket was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("over the 107 a Unix socket takes"));
  }
}

TEST_F(SocketTest, TheDirectoryIsCreatedPrivate) {
  prepare_socket_dir(dir_, std::nullopt);
  struct stat st {};
  ASSERT_EQ(lstat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  fs::remove(dir_);
  const mode_t old = umask(077);  // the group bits survive any umask
  prepare_socket_dir(dir_, getegid());
  umask(old);
  ASSERT_EQ(lstat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_gid, getegid());
  prepare_socket_dir(dir_, getegid());  // an existing good one is kept
}

TEST_F(SocketTest, ASquattedDirectoryIsRefusedNamingWhy) {
  const auto error = [&] {
    try {
      prepare_socket_dir(dir_, std::nullopt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ASSERT_EQ(mkdir(dir_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
  EXPECT_THAT(error(),
              AllOf(HasSubstr(dir_), HasSubstr("mode 0777"), HasSubstr("writable by its group or others")));
  ASSERT_EQ(chmod(dir_.c_str(), 0720), 0);
  EXPECT_THAT(error(), HasSubstr("writable by its group or others"));
  fs::remove(dir_);
  const std::string target = dir_ + "-target";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), dir_.c_str()), 0);
  EXPECT_THAT(error(), AllOf(HasSubstr(dir_), HasSubstr("symlink")));
  fs::remove(dir_);
  fs::remove(target);
  if (geteuid() == 0) {
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
    ASSERT_EQ(chown(dir_.c_str(), kNobody, kNobody), 0);
    EXPECT_THAT(error(), AllOf(HasSubstr(dir_), HasSubstr(fmt::format("owner uid {}", kNobody)),
                               HasSubstr("not owned by this worker's uid 0")));
  }
}

TEST_F(SocketTest, AStaleSocketOfItsOwnIsReplacedALiveOneIsNot) {
  prepare_socket_dir(dir_, std::nullopt);
  {  // bound and closed without unlinking: what a killed worker leaves
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path().c_str());
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ASSERT_TRUE(fs::exists(path()));
  std::optional<Listener> live;
  live.emplace(path(), std::nullopt);
  struct stat st {};
  ASSERT_EQ(stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(listener_error(path()), fmt::format("another worker (pid {}) serves {}", getpid(), path()));
  EXPECT_TRUE(fs::exists(path()));
  live.reset();
  EXPECT_FALSE(fs::exists(path()));  // the owner removes its socket
}

TEST_F(SocketTest, APlainFileOrAnotherUsersFileIsNeverRemoved) {
  prepare_socket_dir(dir_, std::nullopt);
  std::ofstream(path()) << "not a socket";
  EXPECT_THAT(
      listener_error(path()),
      AllOf(HasSubstr(path()), HasSubstr("is not a socket of this worker's uid"), HasSubstr("not removed")));
  EXPECT_TRUE(fs::exists(path()));
  if (geteuid() == 0) {
    ASSERT_EQ(chown(path().c_str(), kNobody, kNobody), 0);
    EXPECT_THAT(listener_error(path()), HasSubstr(fmt::format("owner uid {}", kNobody)));
    EXPECT_TRUE(fs::exists(path()));
  }
}

TEST_F(SocketTest, TheDoorAdmitsOneHostAndTellsASecondWhy) {
  HostDoor door(DoorOptions{path(), "", test_model()}, [](Observation& o, StatsMore& more) {
    o.stats.steps = 42;
    more.markov_lookups = 9;
  });
  DoorAnswer early = knock(path(), geteuid(), PeerKind::host, 1s);
  EXPECT_EQ(kind_name(early.kind), "not_ready");
  EXPECT_EQ(early.why, "the worker is starting");
  door.set_state(WorkerState::serving);

  DoorAnswer first = knock(path(), geteuid(), PeerKind::host, 1s);
  ASSERT_EQ(kind_name(first.kind), "accepted") << first.why;
  EXPECT_EQ(first.worker.pid, getpid());
  std::shared_ptr<AdmittedHost> admitted = door.wait_admitted(1s);
  ASSERT_NE(admitted, nullptr);
  EXPECT_EQ(admitted->peer.pid, getpid());
  EXPECT_EQ(admitted->session, 1u);
  SessionAreas areas = SessionAreas::open(std::move(first.worker_area), std::move(first.host_area));
  EXPECT_EQ(areas.worker().session, 1u);

  DoorAnswer second = knock(path(), geteuid(), PeerKind::host, 1s);
  EXPECT_EQ(kind_name(second.kind), "refused");
  EXPECT_EQ(second.why, fmt::format("another host (pid {}) is attached", getpid()));
  EXPECT_EQ(door.refused(), 1u);
  EXPECT_FALSE(door.host_hung_up());

  // An observer is answered while the host is attached, and takes nothing.
  DoorAnswer obs = knock(path(), geteuid(), PeerKind::observer, 1s);
  ASSERT_EQ(kind_name(obs.kind), "accepted") << obs.why;
  EXPECT_FALSE(obs.worker_area);
  EXPECT_EQ(obs.observation.state, static_cast<uint32_t>(WorkerState::serving));
  EXPECT_EQ(obs.observation.host_pid, getpid());
  EXPECT_EQ(obs.observation.worker_pid, getpid());
  EXPECT_EQ(obs.observation.stats.steps, 42u);
  EXPECT_EQ(obs.observation.stats.hosts_refused, 1u);
  EXPECT_EQ(obs.observation_more.markov_lookups, 9u) << "version 6: the reply carries StatsMore";
  EXPECT_EQ(obs.observation.model.vocab_size, test_model().vocab_size);

  // The release closes the host's socket and admits the next host, on new memory.
  door.release();
  pollfd p{first.socket.get(), POLLIN | POLLRDHUP, 0};
  EXPECT_EQ(poll(&p, 1, 2000), 1);
  admitted.reset();
  DoorAnswer next = knock(path(), geteuid(), PeerKind::host, 1s);
  ASSERT_EQ(kind_name(next.kind), "accepted") << next.why;
  ASSERT_NE(door.wait_admitted(1s), nullptr);
  SessionAreas next_areas = SessionAreas::open(std::move(next.worker_area), std::move(next.host_area));
  EXPECT_EQ(next_areas.worker().session, 2u);
  EXPECT_NE(&next_areas.host(), &areas.host());
  // A host that closes its socket is seen at once.
  next.socket.reset();
  for (int i = 0; i < 200 && !door.host_hung_up(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(door.host_hung_up());
}

TEST_F(SocketTest, ABadHelloIsRefusedAndASilentPeerDoesNotStallTheDoor) {
  HostDoor door(DoorOptions{path(), "", test_model(), 200ms}, [](Observation&, StatsMore&) {});
  door.set_state(WorkerState::serving);
  UniqueFd silent = connect_socket(path());  // connects and never says anything
  ASSERT_TRUE(silent);
  UniqueFd junk = connect_socket(path());
  const char garbage[5] = {1, 2, 3, 4, 5};
  ASSERT_TRUE(send_message(junk.get(), garbage, sizeof(garbage)));
  SocketReply reply{};
  size_t bytes = 0;
  ASSERT_EQ(receive_message(junk.get(), &reply, sizeof(reply), 2s, nullptr, 0, &bytes), Received::message);
  EXPECT_EQ(reply.head.admission, static_cast<uint32_t>(Admission::refused));
  EXPECT_THAT(reply.head.reason, HasSubstr("did not send a dspark hello"));
  // Before a hello is read, in the oldest served layout (no StatsMore), which every version's client reads.
  EXPECT_EQ(bytes, socket_reply_bytes(kMinProtocolVersion));
  EXPECT_EQ(bytes, sizeof(SocketReply) - sizeof(StatsMore));
  const auto t0 = std::chrono::steady_clock::now();
  DoorAnswer a = knock(path(), geteuid(), PeerKind::host, 2s);
  EXPECT_EQ(kind_name(a.kind), "accepted") << a.why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(door.refused(), 1u);
}

// The compatibility rule (protocol.hpp): this worker serves protocol versions 3 to 7. A hello of any other
// version, from a host or an observer, gets the frozen head alone (magic 8 + version 4 + admission 4 + reason
// 256 bytes), refused in version 7, the reason naming both versions; each is counted.
TEST_F(SocketTest, AHelloOfAnotherVersionIsRefusedNamingBothVersions) {
  HostDoor door(DoorOptions{path(), "", test_model(), 200ms}, [](Observation&, StatsMore&) {});
  door.set_state(WorkerState::serving);
  for (const uint32_t version : {2u, 8u}) {
    for (const PeerKind kind : {PeerKind::host, PeerKind::observer}) {
      UniqueFd fd = connect_socket(path());
      const SocketHello hello{kSocketMagic, version, static_cast<uint32_t>(kind)};
      ASSERT_TRUE(send_message(fd.get(), &hello, sizeof(hello)));
      SocketReply reply{};
      size_t bytes = 0;
      std::vector<UniqueFd> fds;
      ASSERT_EQ(receive_message(fd.get(), &reply, sizeof(reply), 2s, &fds, 2, &bytes), Received::message);
      EXPECT_EQ(bytes, 272u);
      EXPECT_TRUE(fds.empty());
      EXPECT_EQ(reply.head.magic, kSocketMagic);
      EXPECT_EQ(reply.head.version, 7u);
      EXPECT_EQ(reply.head.admission, static_cast<uint32_t>(Admission::refused));
      EXPECT_EQ(
          std::string(reply.head.reason),
          fmt::format("the client speaks protocol version {}; this worker serves protocol versions 3 to 7",
                      version));
    }
  }
  EXPECT_EQ(door.refused(), 4u);
  EXPECT_EQ(door.host_pid(), 0);
  DoorAnswer a = knock(path(), geteuid(), PeerKind::host, 2s);  // this build's version is served
  EXPECT_EQ(kind_name(a.kind), "accepted") << a.why;
}

TEST_F(SocketTest, AVersion3HostIsAdmittedInVersion3) {
  // The oldest served version: the reply and the worker area say 3 (the layout its messages are read in).
  HostDoor door(DoorOptions{path(), "", test_model(), 200ms}, [](Observation&, StatsMore&) {});
  door.set_state(WorkerState::serving);
  UniqueFd fd = connect_socket(path());
  const SocketHello hello{kSocketMagic, 3u, static_cast<uint32_t>(PeerKind::host)};
  ASSERT_TRUE(send_message(fd.get(), &hello, sizeof(hello)));
  SocketReply reply{};
  std::vector<UniqueFd> fds;
  size_t bytes = 0;
  ASSERT_EQ(receive_message(fd.get(), &reply, sizeof(reply), 2s, &fds, 2, &bytes), Received::message);
  EXPECT_EQ(reply.head.admission, static_cast<uint32_t>(Admission::accepted)) << reply.head.reason;
  EXPECT_EQ(reply.head.version, 3u);
  EXPECT_EQ(bytes, 272u + sizeof(Observation))
      << "version 3's reply: the head and the Observation, no StatsMore";
  ASSERT_EQ(fds.size(), 2u);
  WorkerHeader h{};
  ASSERT_EQ(pread(fds[0].get(), &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.version, 3u);
  const std::shared_ptr<AdmittedHost> admitted = door.wait_admitted(2s);
  ASSERT_NE(admitted, nullptr);
  EXPECT_EQ(admitted->version, 3u);
}

// Processes of another user get nothing: an owner-only socket cannot even be reached, and one they can reach
// (the group's directory) refuses them before reading a byte. A member of ring.group is admitted.
TEST_F(SocketTest, AnotherUidIsRefusedAndAGroupMemberIsAdmitted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another uid";
  {
    std::optional<HostDoor> door;
    const std::string said = as_user(
        kNobody, kNobody,
        [&] {
          door.emplace(DoorOptions{path(), "", test_model()}, [](Observation&, StatsMore&) {});
          door->set_state(WorkerState::serving);
        },
        [&] {
          DoorAnswer a = knock(path(), 0, PeerKind::host, 1s);
          return kind_name(a.kind) + ": " + a.why;
        });
    EXPECT_THAT(said, AllOf(HasSubstr("refused: cannot connect to"), HasSubstr("Permission denied")));
    EXPECT_EQ(door->wait_admitted(0ms), nullptr);
  }
  fs::remove_all(dir_);
  std::optional<HostDoor> door;
  const auto start = [&] {
    door.emplace(DoorOptions{path(), "nogroup", test_model()}, [](Observation&, StatsMore&) {});
    door->set_state(WorkerState::serving);
  };
  // Group nogroup reaches the socket; uid kNoUser is no member of it.
  std::string said = as_user(kNoUser, kNobody, start, [&] {
    DoorAnswer a = knock(path(), 0, PeerKind::host, 1s);
    return kind_name(a.kind) + ": " + a.why;
  });
  EXPECT_THAT(said,
              AllOf(HasSubstr("refused"), HasSubstr(fmt::format("uid {}", kNoUser)),
                    HasSubstr("may not use this worker: it admits uid 0 and the members of group nogroup")));
  EXPECT_EQ(door->refused(), 1u);
  EXPECT_EQ(door->wait_admitted(0ms), nullptr);
  // nobody's primary group is nogroup: a member.
  said = as_user(
      kNobody, kNobody, [] {},
      [&] {
        DoorAnswer a = knock(path(), 0, PeerKind::host, 1s);
        if (a.kind != DoorAnswer::Kind::accepted) return kind_name(a.kind) + ": " + a.why;
        try {
          SessionAreas s = SessionAreas::open(std::move(a.worker_area), std::move(a.host_area));
          return fmt::format("accepted session {}", s.worker().session);
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  EXPECT_EQ(said, "accepted session 1");
  std::shared_ptr<AdmittedHost> h = door->wait_admitted(1s);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->peer.uid, kNobody);
}

// The reverse: another user's listener where a root host expects its worker is refused by the host before it
// sends anything, and a root worker neither serves on that path nor deletes it.
TEST_F(SocketTest, AHostRefusesAWorkerOfAnotherUidAndAWorkerLeavesItAlone) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another uid";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t squatter = fork();
  ASSERT_GE(squatter, 0);
  if (squatter == 0) {
    const gid_t g = kNobody;
    if (setgroups(1, &g) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(3);
    if (mkdir(dir_.c_str(), 0755) != 0) _exit(4);
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path().c_str());
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd.get(), 8) != 0 ||
        chmod(path().c_str(), 0666) != 0)
      _exit(5);
    const char b = 1;
    if (write(ready[1], &b, 1) != 1) _exit(6);
    for (;;) pause();
  }
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  DoorAnswer a = knock(path(), 0, PeerKind::host, 1s);
  EXPECT_EQ(kind_name(a.kind), "wrong_owner");
  EXPECT_EQ(a.why, fmt::format("the worker at {} runs as uid {}, expected 0", path(), kNobody));
  EXPECT_THAT(listener_error(path()),
              AllOf(HasSubstr(dir_), HasSubstr(fmt::format("owner uid {}", kNobody))));
  EXPECT_TRUE(fs::exists(path()));
  // Expecting that uid, the same host talks to it (dspark_attach_as).
  DoorAnswer as_expected = knock(path(), kNobody, PeerKind::host, 200ms);
  EXPECT_NE(kind_name(as_expected.kind), "wrong_owner");
  kill(squatter, SIGKILL);
  waitpid(squatter, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace dspark::host
