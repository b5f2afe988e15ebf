// C++ objects whose classes the reader names by their vtables
// (forensics/reader/types.py), in a plain process and under libtag.
//
//   plain_objects
//
// Prints "session ADDR", "connection ADDR" (leaked: its only pointer
// dropped), "packet ADDR" and "plain ADDR" (a struct without virtual
// functions: no type can be told), "string ADDR" and "motd ADDR" (the
// characters of a std::string of 40 held in a block, and of one of 100 held
// in a global), then "ready", and waits for stdin to end.
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

struct Session {
    virtual ~Session() {}
    int id = 7;
    char name[40] = "session";
};

struct Connection : Session {
    ~Connection() override {}
    int fd = 3;
};

namespace net {
struct Packet {
    virtual void send() {}
    virtual ~Packet() {}
    char data[64] = {};
};
}  // namespace net

struct Plain {
    long a = 1, b = 2;
};

Session *volatile kept_session;
net::Packet *volatile kept_packet;
Plain *volatile kept_plain;
std::string *volatile kept_string;
std::string motd;

// The leak: its only pointer dies with this frame (no register or live
// stack slot of main's keeps it)
__attribute__((noinline)) static void leak_connection()
{
    Session *c = new Connection;
    std::printf("connection %p\n", (void *)c);
}

int main()
{
    kept_session = new Session;
    leak_connection();
    kept_packet = new net::Packet;
    kept_plain = new Plain;
    kept_string = new std::string(40, 's');
    motd.assign(100, 'm');
    std::printf("session %p\npacket %p\nplain %p\n", (void *)kept_session,
                (void *)kept_packet, (void *)kept_plain);
    std::printf("string %p\nmotd %p\n", (void *)kept_string->data(), (void *)motd.data());
    std::printf("ready\n");
    std::fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
