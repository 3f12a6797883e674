#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace starling {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Reads `fd` from byte `offset` to its end into *out (`hint`: the expected
// size). InvalidArgument naming `path` on a read error.
absl::Status ReadToEnd(int fd, int64_t offset, size_t hint,
                       const std::string& path, std::string* out) {
  out->resize(hint + 4096);
  size_t done = 0;
  while (true) {
    if (done == out->size()) out->resize(out->size() * 2);
    ssize_t n = ::pread(fd, &(*out)[done], out->size() - done,
                        static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return absl::OkStatus();
}

}  // namespace

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::StatusOr<FileReader> FileReader::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("file not found: ", path));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file"));
  }
  return FileReader(path, fd, static_cast<uint64_t>(st.st_size));
}

FileReader::FileReader(FileReader&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Fills out[0, n) through `read_some` (read or pread of the rest), retrying
// on EINTR: a file that ends early is an error, never a short read.
template <typename ReadSome>
absl::Status ReadFully(const std::string& path, char* out, size_t n,
                       ReadSome read_some) {
  while (n > 0) {
    ssize_t got = read_some(out, n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (got == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": it ended ", n,
                       " bytes early (it shrank while being read)"));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FileReader::Read(void* dst, size_t n) {
  return ReadFully(path_, static_cast<char*>(dst), n,
                   [this](char* out, size_t k) { return ::read(fd_, out, k); });
}

absl::Status FileReader::ReadAt(uint64_t offset, void* dst, size_t n) const {
  return ReadFully(
      path_, static_cast<char*>(dst), n, [this, &offset](char* out, size_t k) {
        const ssize_t got = ::pread(fd_, out, k, static_cast<off_t>(offset));
        if (got > 0) offset += static_cast<uint64_t>(got);
        return got;
      });
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  absl::StatusOr<FileReader> file = FileReader::Open(path);
  if (!file.ok()) return file.status();
  // To the end, not to size(): files of /proc report size 0, and a log
  // being appended to may have grown since fstat.
  std::string data;
  absl::Status read =
      ReadToEnd(file->fd_, 0, static_cast<size_t>(file->size()), path, &data);
  if (!read.ok()) return read;
  return data;
}

absl::StatusOr<std::string> ReadFileFrom(const std::string& path,
                                         int64_t offset) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("file not found: ", path));
    }
    return Errno("cannot open", path);
  }
  std::string out;
  absl::Status read = ReadToEnd(fd, offset, 0, path, &out);
  ::close(fd);
  if (!read.ok()) return read;
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view data) {
  return WriteFileAtomic(path, absl::MakeConstSpan(&data, 1));
}

absl::Status WriteFileAtomic(const std::string& path,
                             absl::Span<const absl::string_view> parts) {
  STARLING_ASSIGN_OR_RETURN(AtomicFileWriter file,
                            AtomicFileWriter::Create(path));
  for (absl::string_view part : parts) {
    STARLING_RETURN_IF_ERROR(file.Write(part.data(), part.size()));
  }
  return file.Commit();
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(
    const std::string& path) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  return AtomicFileWriter(path, std::move(tmp), fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      fd_(other.fd_),
      written_(other.written_),
      writeback_from_(other.writeback_from_) {
  other.fd_ = -1;
  other.tmp_.clear();
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

absl::Status AtomicFileWriter::Write(const void* data, size_t n) {
  if (fd_ < 0) return absl::InternalError(absl::StrCat(tmp_, " is closed"));
  STARLING_RETURN_IF_ERROR(WriteAll(
      fd_, absl::string_view(static_cast<const char*>(data), n), tmp_));
  written_ += n;
  // Start writing back every 8 MiB now, while the caller produces the
  // next: Commit's fsync then waits for little more than the tail. Only a
  // hint: fsync still writes whatever this did not.
  constexpr uint64_t kWritebackBytes = 8 << 20;
  if (written_ - writeback_from_ >= kWritebackBytes) {
    (void)::sync_file_range(fd_, static_cast<off_t>(writeback_from_),
                            static_cast<off_t>(written_ - writeback_from_),
                            SYNC_FILE_RANGE_WRITE);
    writeback_from_ = written_;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::InternalError(absl::StrCat(tmp_, " is closed"));
  absl::Status st;
  if (::fsync(fd_) != 0) st = Errno("fsync", tmp_);
  if (::close(fd_) != 0 && st.ok()) st = Errno("close", tmp_);
  fd_ = -1;
  if (st.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    st = Errno("rename to", path_);
  }
  if (!st.ok()) return st;  // the destructor removes the temporary file
  tmp_.clear();
  int dir = ::open(DirName(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

absl::Status AppendLine(const std::string& path, absl::string_view line) {
  int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open", path);
  std::string buf = absl::StrCat(line, "\n");
  absl::Status st = WriteAll(fd, buf, path);
  ::close(fd);
  return st;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("mkdir", partial);
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status CheckDirWritable(const std::string& path) {
  STARLING_RETURN_IF_ERROR(MakeDirs(path));
  const std::string probe = absl::StrCat(path, "/.starling-write-probe");
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(probe, "probe\n"));
  if (::unlink(probe.c_str()) != 0) return Errno("cannot remove", probe);
  return absl::OkStatus();
}

}  // namespace starling
